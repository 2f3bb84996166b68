//! Decoding Kafka records into stream records: a user function over [`KafkaMessage`], with
//! raw bytes and JSON (serde) built in. Record timestamps are part of the message.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A consumed Kafka record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaMessage {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub payload: Option<Vec<u8>>,
    /// Record timestamp (ms since the epoch), for event time.
    pub timestamp_ms: Option<i64>,
}

/// Turns a consumed record into a stream record. The source hands each message over by value
/// ([`Decoder::decode_owned`]), so [`Decoder::raw`] moves the message instead of copying its
/// key and value a second time.
pub struct Decoder<T>(Arc<dyn Fn(KafkaMessage) -> T + Send + Sync>);

impl<T> Clone for Decoder<T> {
    fn clone(&self) -> Self {
        Decoder(self.0.clone())
    }
}

impl<T> Decoder<T> {
    /// A decoder from a function.
    pub fn new(f: impl Fn(&KafkaMessage) -> T + Send + Sync + 'static) -> Self {
        Decoder(Arc::new(move |m: KafkaMessage| f(&m)))
    }

    /// A decoder from a function that takes the message by value (no copy needed to keep
    /// its key or value).
    pub fn from_owned(f: impl Fn(KafkaMessage) -> T + Send + Sync + 'static) -> Self {
        Decoder(Arc::new(f))
    }

    /// Decodes one message (a copy of it: prefer [`Self::decode_owned`]).
    pub fn decode(&self, m: &KafkaMessage) -> T {
        (self.0)(m.clone())
    }

    /// Decodes one message, consuming it.
    pub fn decode_owned(&self, m: KafkaMessage) -> T {
        (self.0)(m)
    }
}

impl Decoder<KafkaMessage> {
    /// The message itself (raw bytes, key, timestamp, position).
    pub fn raw() -> Self {
        Decoder::from_owned(|m| m)
    }
}

impl<V: DeserializeOwned + 'static> Decoder<std::result::Result<V, String>> {
    /// The value parsed as JSON; `Err(reason)` for a missing or unparsable value (route it
    /// to a dead-letter topic, for instance).
    pub fn json() -> Self {
        Decoder::new(|m: &KafkaMessage| match &m.payload {
            Some(p) => serde_json::from_slice::<V>(p).map_err(|e| e.to_string()),
            None => Err("record has no value".to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_raw() {
        let m = KafkaMessage {
            topic: "t".into(),
            partition: 0,
            offset: 3,
            key: None,
            payload: Some(br#"{"a":1}"#.to_vec()),
            timestamp_ms: Some(5),
        };
        let d = Decoder::<std::result::Result<serde_json::Value, String>>::json();
        assert_eq!(d.decode(&m).unwrap()["a"], 1);
        let bad = KafkaMessage {
            payload: Some(b"{".to_vec()),
            ..m.clone()
        };
        assert!(d.decode(&bad).is_err());
        assert_eq!(Decoder::raw().decode(&m), m);
        assert_eq!(Decoder::raw().decode_owned(m.clone()), m);
    }
}
