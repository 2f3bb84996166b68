//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka uses them in
//! SaslAuthenticate, both sides and sans-I/O (the caller moves the messages):
//!
//! - [`client`]: the exchange of a client (the job's recovery committer and start-up checks);
//! - [`server`]: stored credentials and the server side (the bundled broker).
//!
//! One crate serves both so that the two sides share one implementation of the primitives
//! and are tested against each other.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

pub mod client;
pub mod server;

pub use client::{ScramClient, ScramFinal};
pub use server::{parse_client_first, ClientFirst, ScramCredential, ScramServer};

/// The hash a SCRAM mechanism is built on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScramHash {
    /// SCRAM-SHA-256.
    Sha256,
    /// SCRAM-SHA-512.
    Sha512,
}

/// Kafka's minimum iteration count for SCRAM credentials (RFC 7677 recommends at least 4096):
/// a server asking a client for fewer is misconfigured or hostile.
pub const MIN_ITERATIONS: u32 = 4096;
/// A client refuses more iterations than this from a server, as a denial of service.
pub const MAX_ITERATIONS: u32 = 1_000_000;

impl ScramHash {
    /// The SASL mechanism name.
    pub fn mechanism(self) -> &'static str {
        match self {
            ScramHash::Sha256 => "SCRAM-SHA-256",
            ScramHash::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The hash for a mechanism name (case-insensitive).
    pub fn from_mechanism(name: &str) -> Option<Self> {
        match name.to_ascii_uppercase().as_str() {
            "SCRAM-SHA-256" => Some(ScramHash::Sha256),
            "SCRAM-SHA-512" => Some(ScramHash::Sha512),
            _ => None,
        }
    }

    /// `HMAC(key, data)`.
    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key)
                    .expect("HMAC takes keys of any length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
            ScramHash::Sha512 => {
                let mut mac = <Hmac<Sha512> as Mac>::new_from_slice(key)
                    .expect("HMAC takes keys of any length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    /// `H(data)`.
    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => Sha256::digest(data).to_vec(),
            ScramHash::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi(password, salt, iterations)`: PBKDF2 with HMAC of this hash.
    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramHash::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramHash::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// Why an exchange failed. On the server the message goes to the client; on the client it
/// names what was wrong with the server's answer. It never holds a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SCRAM: {0}")]
pub struct ScramError(pub String);

/// Compares without an early exit, so timing does not tell how many leading bytes matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One exchange between this crate's client and server: the server's verdict on the
    /// client-final message, and then the client's on the server-final message.
    fn exchange(
        client: &ScramClient,
        credential: ScramCredential,
    ) -> (Result<(), ScramError>, Result<(), ScramError>) {
        let first = parse_client_first(client.client_first().as_bytes()).unwrap();
        let server = ScramServer::new(credential, first);
        let fin = client
            .client_final(std::str::from_utf8(server.server_first()).unwrap())
            .unwrap();
        match server.finish(fin.message.as_bytes()) {
            Err(e) => (Err(e), Ok(())),
            Ok(answer) => (
                Ok(()),
                fin.verify_server_final(std::str::from_utf8(&answer).unwrap()),
            ),
        }
    }

    /// The client and the server complete exchanges with each other for both hashes and for
    /// user names that need escaping; a wrong password fails on the server, and a server that
    /// holds the stored key (enough to check the proof) but not the server key fails on the
    /// client.
    #[test]
    fn client_and_server_agree() {
        for hash in [ScramHash::Sha256, ScramHash::Sha512] {
            for user in ["alice", "a=b,c"] {
                let credential = ScramCredential::from_password(hash, "pencil", MIN_ITERATIONS);
                let client = ScramClient::new(hash, user, "pencil");
                let first = parse_client_first(client.client_first().as_bytes()).unwrap();
                assert_eq!(first.username, user);
                let (server, client_side) = exchange(&client, credential.clone());
                assert_eq!((server, client_side), (Ok(()), Ok(())));

                let wrong = ScramClient::new(hash, user, "Pencil");
                assert!(exchange(&wrong, credential.clone()).0.is_err());

                let mut impostor = credential.clone();
                impostor.server_key = vec![0; impostor.server_key.len()];
                let (server, client_side) = exchange(&client, impostor);
                assert!(server.is_ok() && client_side.is_err());
            }
        }
    }
}
