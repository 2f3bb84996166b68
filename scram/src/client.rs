//! The client side of SCRAM: client-first, server-first, client-final, server-final, with no
//! channel binding (`n,,`).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

use crate::{ScramError, ScramHash, MAX_ITERATIONS, MIN_ITERATIONS};

/// One SCRAM exchange of a client.
pub struct ScramClient {
    hash: ScramHash,
    password: String,
    client_nonce: String,
    client_first_bare: String,
}

/// The state after the server-first message: the client-final message to send and the
/// server signature to expect.
pub struct ScramFinal {
    /// The client-final message.
    pub message: String,
    server_signature: Vec<u8>,
}

impl std::fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramClient")
            .field("hash", &self.hash)
            .field("password", &"[redacted]")
            .finish()
    }
}

/// `=` and `,` escaped in a SCRAM user name (RFC 5802 5.1).
fn saslname(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

impl ScramClient {
    /// An exchange for `user` with a random nonce.
    pub fn new(hash: ScramHash, user: &str, password: &str) -> ScramClient {
        use rand::Rng;
        let bytes: [u8; 24] = rand::rng().random();
        Self::with_nonce(hash, user, password, &B64.encode(bytes))
    }

    /// An exchange with the given client nonce (tests use the RFC's).
    pub fn with_nonce(hash: ScramHash, user: &str, password: &str, nonce: &str) -> ScramClient {
        ScramClient {
            hash,
            password: password.to_string(),
            client_nonce: nonce.to_string(),
            client_first_bare: format!("n={},r={nonce}", saslname(user)),
        }
    }

    /// The client-first message.
    pub fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// Answers the server-first message with the client-final message.
    pub fn client_final(&self, server_first: &str) -> Result<ScramFinal, ScramError> {
        let attrs = parse_attributes(server_first)?;
        if let Some(e) = attrs.iter().find(|(k, _)| *k == 'e') {
            return Err(ScramError(format!("the server refused: {}", e.1)));
        }
        let get = |key: char| {
            attrs
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
                .ok_or_else(|| ScramError(format!("server-first message without {key}=")))
        };
        let nonce = get('r')?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(ScramError(
                "the server nonce does not extend the client nonce".into(),
            ));
        }
        let salt = B64
            .decode(get('s')?)
            .map_err(|e| ScramError(format!("salt is not base64: {e}")))?;
        let iterations: u32 = get('i')?
            .parse()
            .map_err(|_| ScramError("iteration count is not a number".into()))?;
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(ScramError(format!(
                "iteration count {iterations} outside {MIN_ITERATIONS}..={MAX_ITERATIONS}"
            )));
        }
        let h = self.hash;
        let salted = h.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = h.hmac(&salted, b"Client Key");
        let stored_key = h.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let client_signature = h.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = h.hmac(&salted, b"Server Key");
        let server_signature = h.hmac(&server_key, auth_message.as_bytes());
        Ok(ScramFinal {
            message: format!("{without_proof},p={}", B64.encode(proof)),
            server_signature,
        })
    }
}

impl ScramFinal {
    /// Checks the server-final message: the server proves it knows the credentials.
    pub fn verify_server_final(&self, server_final: &str) -> Result<(), ScramError> {
        let attrs = parse_attributes(server_final)?;
        if let Some(e) = attrs.iter().find(|(k, _)| *k == 'e') {
            return Err(ScramError(format!("the server refused: {}", e.1)));
        }
        let v = attrs
            .iter()
            .find(|(k, _)| *k == 'v')
            .ok_or_else(|| ScramError("server-final message without v=".into()))?;
        let sig = B64
            .decode(v.1)
            .map_err(|e| ScramError(format!("server signature is not base64: {e}")))?;
        if sig != self.server_signature {
            return Err(ScramError(
                "the server signature is wrong: the server does not know the credentials".into(),
            ));
        }
        Ok(())
    }
}

/// `k=v,k=v` attributes of a SCRAM message (values may contain `=`).
fn parse_attributes(msg: &str) -> Result<Vec<(char, &str)>, ScramError> {
    msg.split(',')
        .filter(|p| !p.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            match (chars.next(), chars.next()) {
                (Some(k), Some('=')) if k.is_ascii_alphabetic() => Ok((k, &part[2..])),
                _ => Err(ScramError(format!(
                    "malformed attribute {:?}",
                    part.chars().take(16).collect::<String>()
                ))),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3: user "user", password "pencil".
    #[test]
    fn rfc7677_sha256_vector() {
        let c =
            ScramClient::with_nonce(ScramHash::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(c.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first =
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let f = c.client_final(server_first).unwrap();
        assert_eq!(
            f.message,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        f.verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(f
            .verify_server_final("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .is_err());
        assert!(f.verify_server_final("e=invalid-proof").is_err());
    }

    #[test]
    fn sha512_round_trip_against_a_server_computation() {
        // the server side of RFC 5802 computed here with the same primitives
        let c = ScramClient::with_nonce(ScramHash::Sha512, "a=b,c", "secret", "abc");
        assert_eq!(c.client_first(), "n,,n=a=3Db=2Cc,r=abc");
        let salt = b"0123456789abcdef";
        let server_first = format!("r=abcXYZ,s={},i=4096", B64.encode(salt));
        let f = c.client_final(&server_first).unwrap();
        let h = ScramHash::Sha512;
        let salted = h.salted_password(b"secret", salt, 4096);
        let server_key = h.hmac(&salted, b"Server Key");
        let auth = format!("n=a=3Db=2Cc,r=abc,{server_first},c=biws,r=abcXYZ");
        let sig = h.hmac(&server_key, auth.as_bytes());
        f.verify_server_final(&format!("v={}", B64.encode(sig)))
            .unwrap();
    }

    #[test]
    fn bad_server_messages_are_errors() {
        let c = ScramClient::with_nonce(ScramHash::Sha256, "u", "p", "abc");
        for bad in [
            "r=xyz,s=AAAA,i=4096", // nonce not extended
            "r=abc,s=AAAA,i=4096", // nonce not extended at all
            "r=abcd,s=!!,i=4096",  // salt not base64
            "r=abcd,s=AAAA,i=1",   // too few iterations
            "r=abcd,s=AAAA,i=x",   // not a number
            "r=abcd,s=AAAA",       // no iterations
            "e=other-error",       // server error
            "garbage",             // not attributes
        ] {
            assert!(c.client_final(bad).is_err(), "{bad}");
        }
        assert!(!format!("{c:?}").contains("\"p\""));
    }
}
