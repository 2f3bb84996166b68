//! The onceflow reference broker: a single-node Kafka-wire-protocol server with a durable log.
//!
//! Start one in-process with [`start`] (tests, examples) or run the `onceflow-broker` binary.
//! Layers, from the wire inwards:
//! - [`server`]: the tokio listener, one task per connection, ordered request pipelining;
//!   [`connection_limits`] caps connections in all and per address, idle time, and frames
//!   before SASL authentication;
//! - [`security`]: listeners (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), TLS, SASL
//!   authentication and per-connection sessions;
//! - [`codec`]: length-prefixed frames, request headers, response encoding, with
//!   [`request_guard`] refusing array counts a frame cannot hold before decoding;
//! - [`handlers`]: one module per Kafka API, dispatched from the advertised version table;
//! - [`txn`]: the transaction coordinator (durable transaction log, markers, timeouts) and
//!   the produce guard of transactional batches;
//! - [`group`]: classic consumer groups and their durable offsets, transactional offsets
//!   staged until the marker;
//! - [`storage`]: per-partition logs (durable or in-memory), idempotent-producer state, the
//!   last stable offset and the aborted-transaction index.
//!
//! ```no_run
//! # async fn demo() -> onceflow_broker::Result<()> {
//! let broker = onceflow_broker::start(onceflow_broker::BrokerConfig::default()).await?;
//! println!("bootstrap.servers={}", broker.bootstrap_servers());
//! broker.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod allocator;
pub mod bufpool;
pub mod codec;
pub mod config;
pub mod connection_limits;
pub mod decompress;
pub mod error;
pub mod framed_log;
pub mod group;
pub mod handlers;
pub mod metrics;
pub mod producer_ids;
pub mod record_timestamps;
pub mod request_guard;
pub mod security;
pub mod server;
pub mod state;
pub mod storage;
pub mod txn;

pub use config::BrokerConfig;
pub use error::{BrokerError, Result};
pub use server::{start, BrokerHandle};

/// CRC-32C (Castagnoli) of `data`, as record batches, index entries and the broker's own
/// framed files carry it.
pub fn crc32c(data: &[u8]) -> u32 {
    // The 32-bit algorithm's checksum fits in the low 32 bits.
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_is_castagnolis_crc() {
        // The check value of CRC-32C (iSCSI), and a batch-sized input against the bitwise
        // definition.
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(super::crc32c(b""), 0);
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut crc = !0u32;
        for b in &data {
            crc ^= u32::from(*b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        assert_eq!(super::crc32c(&data), !crc);
    }
}
