//! The broker in-process: on the test's own tokio runtime ([`start_broker`]) or on a private
//! one, so a test thread can block in rdkafka calls ([`InProcessBroker`]); a helper that runs
//! admin-client futures to completion; the subtask identity of a connector driven directly.

use anyhow::Result;
use onceflow_broker::{BrokerConfig, BrokerHandle};
use onceflow_runtime::SubtaskInfo;

/// Starts an in-memory broker on port 0 whose auto-created topics get `partitions` partitions.
pub async fn start_broker(partitions: i32) -> BrokerHandle {
    start_with(BrokerConfig {
        default_partitions: partitions,
        ..BrokerConfig::default()
    })
    .await
}

/// Starts a broker with `config`; panics if it cannot.
pub async fn start_with(config: BrokerConfig) -> BrokerHandle {
    onceflow_broker::start(config).await.expect("broker starts")
}

/// Subtask identity for connector tests that drive a source or sink directly.
pub fn subtask_info(index: usize, parallelism: usize, restored: u64) -> SubtaskInfo {
    SubtaskInfo {
        job_name: "test".into(),
        operator: "kafka".into(),
        node_uid: "n00-kafka".into(),
        index,
        parallelism,
        max_parallelism: 128,
        restored_checkpoint: restored,
    }
}

/// A broker started with [`onceflow_broker::start`] on a private runtime; shut down on drop.
pub struct InProcessBroker {
    runtime: tokio::runtime::Runtime,
    handle: Option<BrokerHandle>,
}

impl InProcessBroker {
    /// Starts a broker with `config` (in memory unless the config names a data dir).
    pub fn start(config: BrokerConfig) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let handle = runtime.block_on(onceflow_broker::start(config))?;
        Ok(Self {
            runtime,
            handle: Some(handle),
        })
    }

    /// `127.0.0.1:PORT` of the listener.
    pub fn bootstrap(&self) -> String {
        self.handle
            .as_ref()
            .map(|h| h.bootstrap_servers())
            .unwrap_or_default()
    }

    /// The broker's handle (metrics address, shutdown).
    pub fn handle(&self) -> &BrokerHandle {
        self.handle.as_ref().expect("broker running")
    }

    /// The bound address of the listener named `name`.
    pub fn listener_addr(&self, name: &str) -> Option<std::net::SocketAddr> {
        self.handle.as_ref()?.listener_addr(name)
    }

    /// The bound address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.handle
            .as_ref()
            .map(|h| h.local_addr())
            .unwrap_or_else(|| std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
    }
}

impl Drop for InProcessBroker {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            self.runtime.block_on(handle.shutdown());
        }
    }
}

/// Runs a future (e.g. an rdkafka admin call, completed by librdkafka's threads) to completion.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map(|rt| rt.block_on(f))
        .unwrap_or_else(|e| panic!("cannot build a current-thread runtime: {e}"))
}
