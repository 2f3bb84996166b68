//! Connectors of onceflow: the generator and replayable in-memory sources, the collecting sink,
//! the exactly-once file sink, and in [`kafka`] the read_committed Kafka source, the
//! transactional Kafka sink and the Kafka job builder ([`kafka::KafkaJob`]), which owns the
//! start-up protocol that makes a Kafka -> Kafka job exactly-once.

mod collect;
mod discard;
mod file;
mod generator;
pub mod kafka;
mod memory;
mod split;

pub use collect::{CollectPending, CollectSink, CollectSinkWriter, Collected};
pub use discard::{DiscardSink, DiscardSinkWriter};
pub use file::{read_committed_lines, FilePending, FileSink, FileSinkMode, FileSinkWriter};
pub use generator::Generator;
pub use memory::MemorySource;
pub use split::{IndexedSource, SplitPosition};
