//! One request frame (size prefix removed), as a client could send it, through the broker's
//! whole request path: header decoding, the request guard, the body decoder and the API's
//! handler, against an in-memory broker that lives across inputs. Nothing may panic; every
//! frame gets a response or an error.

#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use onceflow_broker::server::BrokerHandle;
use onceflow_broker::storage::StorageConfig;
use onceflow_broker::BrokerConfig;

struct Harness {
    rt: tokio::runtime::Runtime,
    broker: BrokerHandle,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let config = BrokerConfig {
            storage: StorageConfig::default(),
            ..BrokerConfig::default()
        };
        let broker = rt
            .block_on(onceflow_broker::start(config))
            .expect("in-memory broker");
        Harness { rt, broker }
    })
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    let state = h.broker.state().clone();
    let frame = Bytes::copy_from_slice(data);
    // Long-polling requests (Fetch with max_wait) must not stall the fuzzer: bound each call.
    let _ = h.rt.block_on(async move {
        tokio::time::timeout(
            std::time::Duration::from_millis(200),
            onceflow_broker::handlers::dispatch(&state, frame),
        )
        .await
    });
});
