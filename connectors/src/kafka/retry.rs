//! Kafka's retriable coordinator errors, and the one budget within which a job rides them out.
//!
//! A group or transaction coordinator that restarts, moves or is still loading its log
//! answers COORDINATOR_LOAD_IN_PROGRESS (14), COORDINATOR_NOT_AVAILABLE (15) or
//! NOT_COORDINATOR (16); one still finishing the previous transaction of an id answers
//! CONCURRENT_TRANSACTIONS (51); a broker that went away shows as REQUEST_TIMED_OUT (7), a
//! dropped connection or every broker down. Kafka's own clients retry all of these, and so
//! does every call the job makes to a coordinator through librdkafka ([`blocking`]) and through
//! its own client (`committer`). A call that is still refused after [`COORDINATOR_BUDGET`]
//! fails the job with [`KafkaError::Unavailable`] (exit code 5), whose message names the
//! error, the coordinator and the time spent.
//!
//! Why 120 s: a restarted one-node Kafka 4.4 serves again within 10-20 s and loads its
//! coordinators within seconds more; a rolling restart moves each coordinator once. Two
//! minutes rides through that with room to spare, and is short enough that a cluster that is
//! really gone is reported while an operator still looks. Calls made while a transaction is
//! open stay within the transaction timeout instead (the broker aborts it past that, and a
//! retry cannot help).

use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};

use crate::kafka::{KafkaError, Result};

/// How long a coordinator call outside an open transaction is retried (see the module docs).
pub const COORDINATOR_BUDGET: Duration = Duration::from_secs(120);

/// The first pause between two attempts; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The longest pause between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Kafka wire error codes a coordinator call retries.
pub fn retriable_code(code: i16) -> bool {
    matches!(code, 7 | 13 | 14 | 15 | 16 | 51)
}

/// The name and meaning of a Kafka error code a coordinator answers, for messages.
pub fn describe_code(code: i16) -> String {
    let what = match code {
        7 => "REQUEST_TIMED_OUT: the broker did not answer in time",
        13 => "NETWORK_EXCEPTION: the connection to the broker dropped",
        14 => "COORDINATOR_LOAD_IN_PROGRESS: the coordinator is still loading its state",
        15 => "COORDINATOR_NOT_AVAILABLE: no coordinator serves this group or transactional id yet",
        16 => "NOT_COORDINATOR: this broker is not (or no longer) the coordinator",
        51 => {
            "CONCURRENT_TRANSACTIONS: the coordinator is still completing an earlier transaction \
             of this id"
        }
        29 => "TOPIC_AUTHORIZATION_FAILED: the principal may not access the topic",
        30 => "GROUP_AUTHORIZATION_FAILED: the principal may not access the group",
        31 => "CLUSTER_AUTHORIZATION_FAILED: the principal may not describe the cluster",
        53 => {
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the principal may not use the transactional id"
        }
        _ => return format!("error code {code}"),
    };
    format!("error {code} {what}")
}

/// librdkafka errors a coordinator call retries: the codes of [`retriable_code`], the local
/// transport failures and timeouts, and any transactional error librdkafka marks retriable.
pub fn retriable(e: &RdError) -> bool {
    if let RdError::Transaction(t) = e {
        if t.is_retriable() {
            return true;
        }
        if t.is_fatal() || t.txn_requires_abort() {
            return false;
        }
    }
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::NetworkException
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::ConcurrentTransactions
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::OperationTimedOut
        )
    )
}

/// Attempts and pauses of one retried call.
#[derive(Debug)]
pub struct Backoff {
    started: Instant,
    deadline: Instant,
    pause: Duration,
    attempts: u32,
}

impl Backoff {
    /// A call that may be retried for `budget`.
    pub fn new(budget: Duration) -> Backoff {
        let started = Instant::now();
        Backoff {
            started,
            deadline: started + budget,
            pause: FIRST_BACKOFF,
            attempts: 0,
        }
    }

    /// Counts a failed attempt; returns the pause before the next one, or None when the
    /// budget does not leave room for it.
    pub fn next_pause(&mut self) -> Option<Duration> {
        self.attempts += 1;
        let pause = self.pause;
        if Instant::now() + pause > self.deadline {
            return None;
        }
        self.pause = (self.pause * 2).min(MAX_BACKOFF);
        Some(pause)
    }

    /// Failed attempts so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Time since the first attempt.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The error of a call that ran out of budget: what was called, on which coordinator,
    /// the last error, the time spent.
    pub fn exhausted(&self, what: &str, coordinator: &str, last: &str) -> KafkaError {
        KafkaError::Unavailable(format!(
            "{what}: the {coordinator} still answered {last} after {:.1} s and {} attempts \
             (the retry budget is {} s; docs/JOBS.md, \"When the cluster is away\")",
            self.elapsed().as_secs_f64(),
            self.attempts,
            (self.deadline - self.started).as_secs()
        ))
    }
}

/// Runs the blocking librdkafka call `f` until it succeeds or fails with an error that is not
/// [`retriable`], pausing between attempts, for at most `budget`. `what` names the call and
/// `coordinator` the coordinator it reaches (e.g. "transaction coordinator of id X"), for the
/// log and for the error past the budget ([`KafkaError::Unavailable`]).
pub fn blocking<T>(
    what: &str,
    coordinator: &str,
    budget: Duration,
    mut f: impl FnMut() -> std::result::Result<T, RdError>,
) -> Result<T> {
    let mut backoff = Backoff::new(budget);
    loop {
        match f() {
            Ok(v) => {
                if backoff.attempts() > 0 {
                    tracing::info!(
                        call = what,
                        coordinator,
                        attempts = backoff.attempts() + 1,
                        elapsed_ms = backoff.elapsed().as_millis() as u64,
                        "coordinator call succeeded after retries"
                    );
                }
                return Ok(v);
            }
            Err(e) if retriable(&e) => {
                metrics::counter!(crate::kafka::metrics::COORDINATOR_RETRIES, "call" => what.to_string())
                    .increment(1);
                let Some(pause) = backoff.next_pause() else {
                    return Err(backoff.exhausted(what, coordinator, &e.to_string()));
                };
                tracing::info!(call = what, coordinator, error = %e, retry_in_ms = pause.as_millis() as u64, "coordinator not ready; retrying");
                std::thread::sleep(pause);
            }
            Err(e) => return Err(KafkaError::client(what.to_string(), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_errors_are_retriable_and_others_are_not() {
        for code in [
            RDKafkaErrorCode::CoordinatorLoadInProgress,
            RDKafkaErrorCode::CoordinatorNotAvailable,
            RDKafkaErrorCode::NotCoordinator,
            RDKafkaErrorCode::ConcurrentTransactions,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
        ] {
            assert!(retriable(&RdError::GroupListFetch(code)), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::InvalidProducerEpoch,
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ] {
            assert!(!retriable(&RdError::GroupListFetch(code)), "{code:?}");
        }
        for code in [14, 15, 16, 51, 7] {
            assert!(retriable_code(code));
            assert!(describe_code(code).contains(&format!("error {code} ")));
        }
        assert!(!retriable_code(0) && !retriable_code(29) && !retriable_code(47));
        assert!(describe_code(16).contains("NOT_COORDINATOR"));
        assert!(!describe_code(16).contains("TLS"));
    }

    #[test]
    fn a_call_is_retried_until_it_succeeds() {
        let mut left = 3;
        let got = blocking(
            "test call",
            "group coordinator of g",
            COORDINATOR_BUDGET,
            || {
                if left > 0 {
                    left -= 1;
                    Err(RdError::GroupListFetch(
                        RDKafkaErrorCode::CoordinatorLoadInProgress,
                    ))
                } else {
                    Ok(7)
                }
            },
        )
        .unwrap();
        assert_eq!((got, left), (7, 0));
    }

    #[test]
    fn a_call_past_its_budget_names_the_error_the_coordinator_and_the_time() {
        let err = blocking(
            "describing group g",
            "group coordinator of g",
            Duration::from_millis(350),
            || -> std::result::Result<(), RdError> {
                Err(RdError::GroupListFetch(RDKafkaErrorCode::NotCoordinator))
            },
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, KafkaError::Unavailable(_)), "{text}");
        assert!(text.contains("describing group g"), "{text}");
        assert!(text.contains("group coordinator of g"), "{text}");
        assert!(text.contains("NotCoordinator"), "{text}");
        assert!(text.contains(" s and "), "{text}");
        assert_eq!(err.exit_code(), crate::kafka::exit_code::UNAVAILABLE);
    }

    #[test]
    fn other_errors_fail_at_once() {
        let mut calls = 0;
        let err = blocking(
            "x",
            "y",
            COORDINATOR_BUDGET,
            || -> std::result::Result<(), RdError> {
                calls += 1;
                Err(RdError::GroupListFetch(
                    RDKafkaErrorCode::GroupAuthorizationFailed,
                ))
            },
        )
        .unwrap_err();
        assert_eq!(calls, 1);
        assert!(matches!(err, KafkaError::Client { .. }));
    }
}
