//! The SASL users file (`--sasl-users FILE`): who may authenticate, with which secret.
//!
//! One entry per line, `USER:MECHANISM:VALUE`; blank lines and lines starting with `#` are
//! ignored:
//!
//! ```text
//! # a plain password: accepted by PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512
//! alice:plain:alice-secret
//! # SCRAM credentials only (no password on disk); PLAIN is checked against them too
//! bob:scram-sha-256:salt=BASE64,iterations=4096,stored_key=BASE64,server_key=BASE64
//! bob:scram-sha-512:salt=BASE64,iterations=4096,stored_key=BASE64,server_key=BASE64
//! ```
//!
//! `onceflow-broker scram-credential --user bob --mechanism SCRAM-SHA-256` prints a SCRAM line
//! (the password is read from stdin). A user with a plain password gets SCRAM credentials
//! derived at start-up with a random salt.
//!
//! SCRAM credentials have 4096..=16384 iterations, Kafka's bounds: a line with more is
//! refused at load, so a PLAIN login (which derives the key from the password it is given)
//! never runs PBKDF2 longer than that. Every PLAIN check costs one derivation, of the
//! user's SHA-256 credential (or its only one), or of a dummy credential with a random salt
//! for an unknown user, so the time a failed login takes does not tell which users exist.
//! The derivation runs on tokio's blocking pool (see `handlers::sasl`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use super::scram::{ScramCredential, ScramHash, MIN_ITERATIONS};
use crate::error::{BrokerError, Result};

/// Most PBKDF2 iterations a stored SCRAM credential may ask for (Kafka's
/// `ScramMechanism` maximum).
pub const MAX_STORED_ITERATIONS: u32 = 16_384;

/// One user's secrets.
#[derive(Clone, Default)]
pub struct UserSecrets {
    plain: Option<String>,
    scram: HashMap<ScramHash, ScramCredential>,
}

/// The users SASL authenticates against. `Debug` shows user names only.
#[derive(Clone, Default)]
pub struct Users {
    users: HashMap<String, UserSecrets>,
}

impl std::fmt::Debug for Users {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.users.keys().collect();
        names.sort();
        f.debug_struct("Users").field("names", &names).finish()
    }
}

impl Users {
    /// Reads and parses a users file; an unreadable file or a bad line is a configuration
    /// error naming the file and line (never the secret).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BrokerError::Config(format!("sasl users file {}: {e}", path.display())))?;
        Self::parse(&text)
            .map_err(|e| BrokerError::Config(format!("sasl users file {}: {e}", path.display())))
    }

    /// Parses the file's text.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let mut users: HashMap<String, UserSecrets> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let lineno = i + 1;
            let mut parts = line.splitn(3, ':');
            let (Some(user), Some(mechanism), Some(value)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(format!("line {lineno}: expected USER:MECHANISM:VALUE"));
            };
            let user = user.trim();
            if user.is_empty() {
                return Err(format!("line {lineno}: empty user name"));
            }
            let entry = users.entry(user.to_string()).or_default();
            let mechanism = mechanism.trim();
            if mechanism.eq_ignore_ascii_case("plain") {
                if value.is_empty() {
                    return Err(format!("line {lineno}: empty password for {user:?}"));
                }
                entry.plain = Some(value.to_string());
            } else if let Some(hash) = ScramHash::from_mechanism(mechanism) {
                let credential = ScramCredential::from_file_value(hash, value.trim())
                    .map_err(|e| format!("line {lineno} ({user:?}): {e}"))?;
                if credential.iterations > MAX_STORED_ITERATIONS {
                    return Err(format!(
                        "line {lineno} ({user:?}): {} iterations, more than the {MAX_STORED_ITERATIONS} allowed",
                        credential.iterations
                    ));
                }
                entry.scram.insert(hash, credential);
            } else {
                return Err(format!(
                    "line {lineno}: unknown mechanism {mechanism:?} (plain, scram-sha-256 or scram-sha-512)"
                ));
            }
        }
        for secrets in users.values_mut() {
            if let Some(password) = &secrets.plain {
                for hash in [ScramHash::Sha256, ScramHash::Sha512] {
                    secrets.scram.entry(hash).or_insert_with(|| {
                        ScramCredential::from_password(hash, password, MIN_ITERATIONS)
                    });
                }
            }
        }
        Ok(Users { users })
    }

    /// Number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether there are no users.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// SASL/PLAIN: whether `password` is the user's. Costs one PBKDF2 derivation whether or
    /// not the user exists (blocking: call it off the async workers).
    pub fn check_plain(&self, user: &str, password: &str) -> bool {
        let (credential, known) = self.plain_credential(user);
        let matches = credential.matches_password(password);
        let plain_matches = match self.users.get(user).and_then(|s| s.plain.as_ref()) {
            Some(p) => super::scram::constant_time_eq(p.as_bytes(), password.as_bytes()),
            None => true,
        };
        known && matches && plain_matches
    }

    /// The credential a PLAIN password for `user` is checked against, and whether it is the
    /// user's own: the SHA-256 credential (derived from a plain password at load), else the
    /// user's other one, else the dummy.
    fn plain_credential(&self, user: &str) -> (&ScramCredential, bool) {
        let own = self.users.get(user).and_then(|s| {
            s.scram
                .get(&ScramHash::Sha256)
                .or_else(|| s.scram.values().next())
        });
        match own {
            Some(c) if c.iterations <= MAX_STORED_ITERATIONS => (c, true),
            _ => (dummy_credential(), false),
        }
    }

    /// The user's SCRAM credential for `hash`.
    pub fn scram(&self, user: &str, hash: ScramHash) -> Option<&ScramCredential> {
        self.users.get(user)?.scram.get(&hash)
    }
}

/// What an unknown user's PLAIN password is derived against: a random password and salt at
/// the iteration count of derived credentials.
fn dummy_credential() -> &'static ScramCredential {
    static DUMMY: OnceLock<ScramCredential> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let mut password = [0u8; 16];
        rand::fill(&mut password);
        let password: String = password.iter().map(|b| format!("{b:02x}")).collect();
        ScramCredential::from_password(ScramHash::Sha256, &password, MIN_ITERATIONS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_file() {
        let bob = ScramCredential::from_password(ScramHash::Sha256, "bob-pw", 4096);
        let text = format!(
            "# comment\n\nalice:plain:a:b:c\nbob:SCRAM-SHA-256:{}\n",
            bob.to_file_value()
        );
        let users = Users::parse(&text).unwrap();
        assert_eq!(users.len(), 2);
        assert!(users.check_plain("alice", "a:b:c"));
        assert!(!users.check_plain("alice", "a:b"));
        assert!(users.check_plain("bob", "bob-pw"));
        assert!(!users.check_plain("carol", "x"));
        assert!(users.scram("alice", ScramHash::Sha512).is_some());
        assert!(users.scram("bob", ScramHash::Sha512).is_none());
        assert!(!format!("{users:?}").contains("a:b:c"));
        assert!(Users::parse("alice").is_err());
        assert!(Users::parse("alice:md5:x").is_err());
        assert!(Users::parse("bob:scram-sha-256:salt=AA==").is_err());
    }

    #[test]
    fn plain_costs_one_bounded_derivation_for_known_and_unknown_users() {
        let over = ScramCredential::from_password(ScramHash::Sha256, "pw", 16_385);
        let err = Users::parse(&format!("eve:scram-sha-256:{}", over.to_file_value()))
            .err()
            .unwrap();
        assert!(err.contains("16385 iterations"), "{err}");
        let at_max = ScramCredential::from_password(ScramHash::Sha512, "pw", 16_384);
        let users = Users::parse(&format!(
            "alice:plain:pw\nbob:scram-sha-512:{}",
            at_max.to_file_value()
        ))
        .unwrap();
        let (alice, known) = users.plain_credential("alice");
        assert!(known && alice.iterations == MIN_ITERATIONS);
        let (bob, known) = users.plain_credential("bob");
        assert!(known && bob.iterations == 16_384 && bob.hash == ScramHash::Sha512);
        // An unknown user is checked against the dummy: the same derivation as alice's.
        let (dummy, known) = users.plain_credential("mallory");
        assert!(!known);
        assert_eq!(
            (dummy.hash, dummy.iterations),
            (alice.hash, alice.iterations)
        );
        assert!(users.check_plain("bob", "pw"));
        assert!(!users.check_plain("mallory", "pw"));
    }
}
