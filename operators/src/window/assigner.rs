//! Window assigners: which windows a record with a given event time belongs to.

use serde::{Deserialize, Serialize};

use onceflow_runtime::{Error, Result};

/// An event-time window `[start, end)` in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Window {
    /// First timestamp inside the window.
    pub start: i64,
    /// First timestamp after the window.
    pub end: i64,
}

impl Window {
    /// The last timestamp inside the window (`end - 1`): the window fires when the watermark
    /// reaches it.
    pub fn max_timestamp(&self) -> i64 {
        self.end.saturating_sub(1)
    }

    /// Whether two windows overlap (session windows that overlap merge).
    pub fn intersects(&self, other: &Window) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// The smallest window covering both.
    pub fn cover(&self, other: &Window) -> Window {
        Window {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// How records are grouped into windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowAssigner {
    /// Fixed, non-overlapping windows of `size` ms, aligned to `offset`.
    Tumbling {
        /// Window length (ms).
        size: i64,
        /// Alignment offset (ms); windows start at `offset + k * size`.
        offset: i64,
    },
    /// Windows of `size` ms starting every `slide` ms: a record is in `ceil(size / slide)`
    /// windows.
    Sliding {
        /// Window length (ms).
        size: i64,
        /// Distance between window starts (ms).
        slide: i64,
    },
    /// Per-key sessions: a record opens `[t, t + gap)`; overlapping sessions merge.
    Session {
        /// Inactivity gap (ms).
        gap: i64,
    },
}

fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl WindowAssigner {
    /// Tumbling windows of `size`.
    pub fn tumbling(size: std::time::Duration) -> Self {
        WindowAssigner::Tumbling {
            size: ms(size),
            offset: 0,
        }
    }

    /// Sliding windows of `size`, one starting every `slide`.
    pub fn sliding(size: std::time::Duration, slide: std::time::Duration) -> Self {
        WindowAssigner::Sliding {
            size: ms(size),
            slide: ms(slide),
        }
    }

    /// Session windows closing after `gap` without records of the key.
    pub fn session(gap: std::time::Duration) -> Self {
        WindowAssigner::Session { gap: ms(gap) }
    }

    /// Checks the parameters (all lengths positive; a sliding slide at most its size).
    pub fn validate(&self) -> Result<()> {
        let ok = match *self {
            WindowAssigner::Tumbling { size, .. } => size > 0,
            WindowAssigner::Sliding { size, slide } => slide > 0 && size >= slide,
            WindowAssigner::Session { gap } => gap > 0,
        };
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidJob(format!(
                "invalid window assigner {self:?}"
            )))
        }
    }

    /// Whether windows merge (sessions).
    pub fn is_merging(&self) -> bool {
        matches!(self, WindowAssigner::Session { .. })
    }

    /// The windows of a record at `ts` (for sessions: its own, not yet merged window).
    pub fn assign(&self, ts: i64) -> Vec<Window> {
        match *self {
            WindowAssigner::Tumbling { size, offset } => {
                let start = ts.saturating_sub((ts.wrapping_sub(offset)).rem_euclid(size));
                vec![Window {
                    start,
                    end: start.saturating_add(size),
                }]
            }
            WindowAssigner::Sliding { size, slide } => {
                let last = ts.saturating_sub(ts.rem_euclid(slide));
                let mut out = Vec::with_capacity(usize::try_from(size / slide + 1).unwrap_or(1));
                let mut start = last;
                loop {
                    let end = start.saturating_add(size);
                    if end <= ts {
                        break;
                    }
                    out.push(Window { start, end });
                    match start.checked_sub(slide) {
                        Some(s) => start = s,
                        None => break,
                    }
                }
                out
            }
            WindowAssigner::Session { gap } => vec![Window {
                start: ts,
                end: ts.saturating_add(gap),
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assigns_tumbling_sliding_and_session_windows() {
        let t = WindowAssigner::Tumbling {
            size: 10,
            offset: 0,
        };
        assert_eq!(t.assign(-1), vec![Window { start: -10, end: 0 }]);
        assert_eq!(t.assign(10), vec![Window { start: 10, end: 20 }]);
        let s = WindowAssigner::Sliding { size: 10, slide: 5 };
        assert_eq!(
            s.assign(7),
            vec![Window { start: 5, end: 15 }, Window { start: 0, end: 10 }]
        );
        assert_eq!(
            WindowAssigner::Session { gap: 3 }.assign(4),
            vec![Window { start: 4, end: 7 }]
        );
        assert!(WindowAssigner::Sliding { size: 5, slide: 10 }
            .validate()
            .is_err());
    }
}
