//! Shared harness of the broker conformance tests: the `onceflow-broker` binary as a child
//! process (port 0, `listening on HOST:PORT` parsed from stdout, kill -9 and restart on the same
//! data dir), a raw Kafka client over `TcpStream` built on the kafka-protocol crate's encoders,
//! and rdkafka helpers that produce and read back records with every detail checked.
//!
//! Every wait in here is bounded: a broker that does not come up, a socket that does not answer
//! and a consumer that does not see its records all end in an error, never a hang.
#![allow(dead_code, unused_imports)]

mod clients;
mod inproc;
mod process;
mod python;
mod raw;

pub use clients::*;
pub use inproc::*;
pub use process::*;
pub use python::*;
pub use raw::*;
