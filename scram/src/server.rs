//! The server side of SCRAM: stored credentials and the two-round exchange.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rand::RngCore;

use crate::{constant_time_eq, ScramError, ScramHash, MIN_ITERATIONS};

/// What the broker stores for a SCRAM user: never the password itself.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// The hash function.
    pub hash: ScramHash,
    /// Random salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iteration count.
    pub iterations: u32,
    /// `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("hash", &self.hash)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// Derives a credential from a password with a fresh random salt.
    pub fn from_password(hash: ScramHash, password: &str, iterations: u32) -> Self {
        let mut salt = vec![0u8; 16];
        rand::rng().fill_bytes(&mut salt);
        Self::derive(hash, password, salt, iterations)
    }

    /// Derives a credential from a password and a given salt.
    pub fn derive(hash: ScramHash, password: &str, salt: Vec<u8>, iterations: u32) -> Self {
        let salted = hash.salted_password(password.as_bytes(), &salt, iterations);
        let client_key = hash.hmac(&salted, b"Client Key");
        ScramCredential {
            hash,
            stored_key: hash.hash(&client_key),
            server_key: hash.hmac(&salted, b"Server Key"),
            salt,
            iterations,
        }
    }

    /// Whether `password` is the one this credential was derived from (SASL/PLAIN against a
    /// SCRAM-only user).
    pub fn matches_password(&self, password: &str) -> bool {
        let derived = Self::derive(self.hash, password, self.salt.clone(), self.iterations);
        constant_time_eq(&derived.stored_key, &self.stored_key)
    }

    /// The users-file form: `salt=B64,iterations=N,stored_key=B64,server_key=B64`.
    pub fn to_file_value(&self) -> String {
        format!(
            "salt={},iterations={},stored_key={},server_key={}",
            B64.encode(&self.salt),
            self.iterations,
            B64.encode(&self.stored_key),
            B64.encode(&self.server_key)
        )
    }

    /// Parses the users-file form.
    pub fn from_file_value(hash: ScramHash, value: &str) -> Result<Self, String> {
        let (mut salt, mut iterations, mut stored, mut server) = (None, None, None, None);
        for part in value.split(',') {
            let (key, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            let decode = |v: &str| B64.decode(v.trim()).map_err(|e| format!("{key}: {e}"));
            match key.trim() {
                "salt" => salt = Some(decode(v)?),
                "iterations" => {
                    iterations = Some(
                        v.trim()
                            .parse::<u32>()
                            .map_err(|e| format!("iterations: {e}"))?,
                    )
                }
                "stored_key" => stored = Some(decode(v)?),
                "server_key" => server = Some(decode(v)?),
                other => return Err(format!("unknown field {other:?}")),
            }
        }
        let key_len = hash.hash(b"").len();
        let credential = ScramCredential {
            hash,
            salt: salt.ok_or("salt missing")?,
            iterations: iterations.ok_or("iterations missing")?,
            stored_key: stored.ok_or("stored_key missing")?,
            server_key: server.ok_or("server_key missing")?,
        };
        if credential.iterations < MIN_ITERATIONS {
            return Err(format!("iterations must be at least {MIN_ITERATIONS}"));
        }
        if credential.stored_key.len() != key_len || credential.server_key.len() != key_len {
            return Err(format!(
                "stored_key and server_key must be {key_len} bytes for {}",
                hash.mechanism()
            ));
        }
        Ok(credential)
    }
}

/// The client-first message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// The gs2 header (`n,,` or `y,,` with an optional `a=authzid`), echoed in `c=`.
    pub gs2_header: String,
    /// The user name (`=2C`/`=3D` decoded).
    pub username: String,
    /// The client nonce.
    pub nonce: String,
    /// The message without the gs2 header.
    pub bare: String,
}

/// Parses `gs2-header client-first-message-bare`.
pub fn parse_client_first(message: &[u8]) -> Result<ClientFirst, ScramError> {
    let text = std::str::from_utf8(message)
        .map_err(|_| ScramError("client-first message is not UTF-8".into()))?;
    let bad = || ScramError("malformed SCRAM client-first message".into());
    let mut parts = text.splitn(3, ',');
    let cbind = parts.next().ok_or_else(bad)?;
    let authzid = parts.next().ok_or_else(bad)?;
    let bare = parts.next().ok_or_else(bad)?;
    match cbind {
        "n" | "y" => {}
        _ if cbind.starts_with("p=") => {
            return Err(ScramError("channel binding is not supported".into()))
        }
        _ => return Err(bad()),
    }
    let gs2_header = format!("{cbind},{authzid},");
    let (mut username, mut nonce) = (None, None);
    for attr in bare.split(',') {
        if let Some(v) = attr.strip_prefix("n=") {
            username = Some(decode_saslname(v).ok_or_else(bad)?);
        } else if let Some(v) = attr.strip_prefix("r=") {
            nonce = Some(v.to_string());
        } else if attr.starts_with("m=") {
            return Err(ScramError(
                "mandatory SCRAM extensions are not supported".into(),
            ));
        }
        // Other attributes are extensions (e.g. Kafka's tokenauth); they are ignored.
    }
    let username = username.filter(|u| !u.is_empty()).ok_or_else(bad)?;
    let nonce = nonce.filter(|n| !n.is_empty()).ok_or_else(bad)?;
    if let Some(authzid) = authzid.strip_prefix("a=") {
        if decode_saslname(authzid).as_deref() != Some(username.as_str()) {
            return Err(ScramError(
                "authorization id must be empty or the user name".into(),
            ));
        }
    }
    Ok(ClientFirst {
        gs2_header,
        username,
        nonce,
        bare: bare.to_string(),
    })
}

fn decode_saslname(v: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The server side of one exchange after the client-first message.
#[derive(Debug)]
pub struct ScramServer {
    credential: ScramCredential,
    client_first: ClientFirst,
    server_first: String,
    nonce: String,
}

impl ScramServer {
    /// Starts the exchange; [`ScramServer::server_first`] is the reply.
    pub fn new(credential: ScramCredential, client_first: ClientFirst) -> Self {
        let mut random = [0u8; 18];
        rand::rng().fill_bytes(&mut random);
        let nonce = format!("{}{}", client_first.nonce, B64.encode(random));
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        ScramServer {
            credential,
            client_first,
            server_first,
            nonce,
        }
    }

    /// The hash function of the exchange.
    pub fn hash(&self) -> ScramHash {
        self.credential.hash
    }

    /// The server-first message.
    pub fn server_first(&self) -> &[u8] {
        self.server_first.as_bytes()
    }

    /// Checks the client-final message; returns the server-final message (`v=...`).
    pub fn finish(&self, client_final: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = std::str::from_utf8(client_final)
            .map_err(|_| ScramError("client-final message is not UTF-8".into()))?;
        let bad = || ScramError("malformed SCRAM client-final message".into());
        let (without_proof, proof) = text.rsplit_once(",p=").ok_or_else(bad)?;
        let (mut channel, mut nonce) = (None, None);
        for attr in without_proof.split(',') {
            if let Some(v) = attr.strip_prefix("c=") {
                channel = Some(v);
            } else if let Some(v) = attr.strip_prefix("r=") {
                nonce = Some(v);
            }
        }
        let expected_channel = B64.encode(self.client_first.gs2_header.as_bytes());
        if channel != Some(expected_channel.as_str()) {
            return Err(ScramError("channel binding does not match".into()));
        }
        // librdkafka repeats the client nonce in front of the combined nonce; Kafka accepts
        // any nonce that ends with the server-first one, and so does this check.
        if !nonce.is_some_and(|n| n.ends_with(self.nonce.as_str())) {
            return Err(ScramError("nonce does not match".into()));
        }
        let proof = B64.decode(proof).map_err(|_| bad())?;
        let auth_message = format!(
            "{},{},{}",
            self.client_first.bare, self.server_first, without_proof
        );
        let hash = self.credential.hash;
        let client_signature = hash.hmac(&self.credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(invalid_credentials(hash));
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        if !constant_time_eq(&hash.hash(&client_key), &self.credential.stored_key) {
            return Err(invalid_credentials(hash));
        }
        let server_signature = hash.hmac(&self.credential.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

fn invalid_credentials(hash: ScramHash) -> ScramError {
    ScramError(format!(
        "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
        hash.mechanism()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3's SCRAM-SHA-256 example, end to end.
    #[test]
    fn rfc7677_example() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = ScramCredential::derive(ScramHash::Sha256, "pencil", salt, 4096);
        let first = parse_client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
        assert_eq!(first.username, "user");
        let mut server = ScramServer::new(credential, first);
        // Replace the random nonce with the RFC's to reproduce its messages.
        server.nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into();
        server.server_first = format!("r={},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", server.nonce);
        let last = server
            .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        let bad = server.finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAAZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
        assert!(bad.is_err());
    }

    #[test]
    fn credential_file_value_round_trip() {
        let c = ScramCredential::from_password(ScramHash::Sha512, "secret", 4096);
        let back = ScramCredential::from_file_value(ScramHash::Sha512, &c.to_file_value()).unwrap();
        assert_eq!(back, c);
        assert!(back.matches_password("secret"));
        assert!(!back.matches_password("Secret"));
        assert!(ScramCredential::from_file_value(ScramHash::Sha256, &c.to_file_value()).is_err());
    }

    #[test]
    fn client_first_parsing() {
        assert!(parse_client_first(b"p=tls-unique,,n=u,r=x").is_err());
        assert!(parse_client_first(b"n,,r=x").is_err());
        assert!(parse_client_first(b"garbage").is_err());
        let f = parse_client_first(b"n,a=a=3Db,n=a=3Db,r=x,tokenauth=true").unwrap();
        assert_eq!(f.username, "a=b");
    }
}
