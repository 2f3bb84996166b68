//! A tiny raw Kafka client (kafka-protocol encoders over a blocking socket) for the requests
//! a two-phase-commit committer sends itself: FindCoordinator and EndTxn.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::{
    EndTxnRequest, FindCoordinatorRequest, ProducerId, RequestHeader, ResponseHeader,
    TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

/// One connection, one request at a time.
pub struct Raw {
    stream: TcpStream,
    correlation: i32,
}

impl Raw {
    /// Connects to `addr` ("HOST:PORT").
    pub fn connect(addr: &str) -> Raw {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        Raw {
            stream,
            correlation: 0,
        }
    }

    /// Sends `req` at `version` and decodes the answer.
    pub fn request<R: Request>(&mut self, req: &R, version: i16) -> R::Response {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("txn-raw-committer")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .expect("encode header");
        req.encode(&mut body, version).expect("encode body");
        let mut frame = BytesMut::new();
        frame.put_i32(body.len() as i32);
        frame.put_slice(&body);
        self.stream.write_all(&frame).expect("write");
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).expect("read length");
        let mut buf = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut buf).expect("read frame");
        let mut buf = bytes::Bytes::from(buf);
        let h = ResponseHeader::decode(&mut buf, R::Response::header_version(version))
            .expect("response header");
        assert_eq!(h.correlation_id, self.correlation);
        let resp = R::Response::decode(&mut buf, version).expect("response body");
        assert!(!buf.has_remaining(), "trailing bytes");
        resp
    }
}

/// Finds the transaction coordinator of `txn_id` through `bootstrap` and sends it
/// EndTxn(commit or abort) for (producer id, epoch). Returns the error code.
pub fn end_txn(bootstrap: &str, txn_id: &str, producer_id: i64, epoch: i16, commit: bool) -> i16 {
    let mut c = Raw::connect(bootstrap);
    let fc = c.request(
        &FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(txn_id.to_string()))
            .with_key_type(1),
        1,
    );
    assert_eq!(fc.error_code, 0, "FindCoordinator failed");
    let mut coord = Raw::connect(&format!("{}:{}", fc.host.as_str(), fc.port));
    coord
        .request(
            &EndTxnRequest::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(txn_id.to_string())))
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(epoch)
                .with_committed(commit),
            1,
        )
        .error_code
}
