//! Input side of a subtask: typed receivers (one per upstream subtask and edge) merged by an
//! [`InputGate`] that aligns checkpoint barriers by not polling an input that has already
//! delivered the pending barrier, and combines watermarks by minimum.

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::element::{Barrier, StreamElement, Watermark};
use crate::{Error, Result};

/// A receiver that yields elements of the consumer's input type.
pub trait InputReceiver<In>: Send {
    /// Polls the next element; `Ready(None)` means the channel closed.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamElement<In>>>;
}

/// Receives elements of the same type as sent.
pub struct DirectReceiver<T>(pub mpsc::Receiver<StreamElement<T>>);

impl<T: Send> InputReceiver<T> for DirectReceiver<T> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamElement<T>>> {
        self.0.poll_recv(cx)
    }
}

/// Receives elements and maps records into the consumer's input type (e.g. one side of a
/// two-input operator).
pub struct MappedReceiver<T, In> {
    rx: mpsc::Receiver<StreamElement<T>>,
    map: fn(T) -> In,
}

impl<T, In> MappedReceiver<T, In> {
    /// Wraps `rx`, applying `map` to every record.
    pub fn new(rx: mpsc::Receiver<StreamElement<T>>, map: fn(T) -> In) -> Self {
        MappedReceiver { rx, map }
    }
}

impl<T: Send, In: Send> InputReceiver<In> for MappedReceiver<T, In> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamElement<In>>> {
        self.rx.poll_recv(cx).map(|o| {
            o.map(|e| match e {
                StreamElement::Records(v) => {
                    StreamElement::Records(v.into_iter().map(self.map).collect())
                }
                StreamElement::Watermark(w) => StreamElement::Watermark(w),
                StreamElement::Barrier(b) => StreamElement::Barrier(b),
                StreamElement::Idleness(i) => StreamElement::Idleness(i),
                StreamElement::EndOfStream => StreamElement::EndOfStream,
            })
        })
    }
}

/// What the gate delivers to the task.
#[derive(Debug)]
pub enum GateEvent<In> {
    /// A batch of records.
    Records(Vec<In>),
    /// The minimum watermark over all open inputs advanced.
    Watermark(Watermark),
    /// (event time) Every open input became idle (`true`) or one is active again (`false`).
    Idleness(bool),
    /// Every input delivered this barrier; `alignment` is the time spent waiting.
    Barrier {
        /// The aligned barrier.
        barrier: Barrier,
        /// Time from the first to the last input delivering it.
        alignment: Duration,
    },
    /// Every input ended.
    End,
}

struct Input<In> {
    rx: Box<dyn InputReceiver<In>>,
    blocked: bool,
    ended: bool,
    watermark: Option<Watermark>,
    /// (event time) The input declared its watermark idle.
    idle: bool,
}

struct Aligning {
    barrier: Barrier,
    started: Instant,
    arrived: usize,
}

/// Merges a subtask's inputs, aligning barriers.
pub struct InputGate<In> {
    inputs: Vec<Input<In>>,
    next: usize,
    aligning: Option<Aligning>,
    emitted_watermark: Option<Watermark>,
    /// (event time) Idleness last reported downstream.
    emitted_idle: bool,
    finished: bool,
}

impl<In: Send> InputGate<In> {
    /// A gate over `inputs` (at least one).
    pub fn new(inputs: Vec<Box<dyn InputReceiver<In>>>) -> Self {
        InputGate {
            inputs: inputs
                .into_iter()
                .map(|rx| Input {
                    rx,
                    blocked: false,
                    ended: false,
                    watermark: None,
                    idle: false,
                })
                .collect(),
            next: 0,
            aligning: None,
            emitted_watermark: None,
            emitted_idle: false,
            finished: false,
        }
    }

    /// Number of inputs.
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    /// Whether the gate has no inputs.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// Whether input `i` is currently held back by alignment.
    pub fn is_blocked(&self, i: usize) -> bool {
        self.inputs[i].blocked
    }

    /// The next event; cancel safe.
    pub async fn next(&mut self) -> Result<GateEvent<In>> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn open_inputs(&self) -> usize {
        self.inputs.iter().filter(|i| !i.ended).count()
    }

    fn min_watermark(&self) -> Option<Watermark> {
        let mut min: Option<Watermark> = None;
        // (event time) idle inputs do not hold the minimum back
        for i in self.inputs.iter().filter(|i| !i.ended && !i.idle) {
            match i.watermark {
                None => return None,
                Some(w) => min = Some(min.map_or(w, |m| m.min(w))),
            }
        }
        min
    }

    fn try_finish_alignment(&mut self) -> Option<GateEvent<In>> {
        let open = self.open_inputs();
        let a = self.aligning.as_ref()?;
        if a.arrived < open {
            return None;
        }
        let a = self.aligning.take()?;
        for i in &mut self.inputs {
            i.blocked = false;
        }
        Some(GateEvent::Barrier {
            barrier: a.barrier,
            alignment: a.started.elapsed(),
        })
    }

    fn watermark_event(&mut self) -> Option<GateEvent<In>> {
        let w = self.min_watermark()?;
        if self.emitted_watermark.is_some_and(|e| e >= w) {
            return None;
        }
        self.emitted_watermark = Some(w);
        Some(GateEvent::Watermark(w))
    }

    /// (event time) Reports a change of "every open input is idle".
    fn idleness_event(&mut self) -> Option<GateEvent<In>> {
        let open = self.inputs.iter().filter(|i| !i.ended);
        let all_idle = open.clone().count() > 0 && open.clone().all(|i| i.idle);
        if all_idle == self.emitted_idle {
            return None;
        }
        self.emitted_idle = all_idle;
        Some(GateEvent::Idleness(all_idle))
    }

    /// Polls the inputs round-robin, skipping blocked and ended ones.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<GateEvent<In>>> {
        if self.finished {
            return Poll::Ready(Ok(GateEvent::End));
        }
        let n = self.inputs.len();
        'scan: loop {
            if self.open_inputs() == 0 {
                self.finished = true;
                return Poll::Ready(Ok(GateEvent::End));
            }
            for step in 0..n {
                let idx = (self.next + step) % n;
                let input = &mut self.inputs[idx];
                if input.blocked || input.ended {
                    continue;
                }
                match input.rx.poll_recv(cx) {
                    Poll::Pending => continue,
                    Poll::Ready(Some(StreamElement::Records(v))) => {
                        self.next = (idx + 1) % n;
                        return Poll::Ready(Ok(GateEvent::Records(v)));
                    }
                    Poll::Ready(Some(StreamElement::Watermark(w))) => {
                        input.watermark = Some(input.watermark.map_or(w, |o| o.max(w)));
                        if let Some(ev) = self.watermark_event() {
                            return Poll::Ready(Ok(ev));
                        }
                        continue 'scan;
                    }
                    Poll::Ready(Some(StreamElement::Idleness(idle))) => {
                        input.idle = idle;
                        // active again: say so before any watermark; idle: after it
                        if !idle {
                            if let Some(ev) = self.idleness_event() {
                                return Poll::Ready(Ok(ev));
                            }
                        }
                        if let Some(ev) = self.watermark_event() {
                            return Poll::Ready(Ok(ev));
                        }
                        if let Some(ev) = self.idleness_event() {
                            return Poll::Ready(Ok(ev));
                        }
                        continue 'scan;
                    }
                    Poll::Ready(Some(StreamElement::Barrier(b))) => {
                        input.blocked = true;
                        match &mut self.aligning {
                            None => {
                                self.aligning = Some(Aligning {
                                    barrier: b,
                                    started: Instant::now(),
                                    arrived: 1,
                                })
                            }
                            Some(a) if a.barrier.checkpoint_id == b.checkpoint_id => a.arrived += 1,
                            Some(a) => {
                                return Poll::Ready(Err(Error::Internal(format!(
                                    "barrier {} arrived while aligning barrier {}",
                                    b.checkpoint_id, a.barrier.checkpoint_id
                                ))))
                            }
                        }
                        if let Some(ev) = self.try_finish_alignment() {
                            return Poll::Ready(Ok(ev));
                        }
                        continue 'scan;
                    }
                    Poll::Ready(Some(StreamElement::EndOfStream)) => {
                        input.ended = true;
                        if let Some(a) = &self.aligning {
                            return Poll::Ready(Err(Error::Internal(format!(
                                "an input ended while aligning barrier {}",
                                a.barrier.checkpoint_id
                            ))));
                        }
                        if let Some(ev) = self.watermark_event() {
                            return Poll::Ready(Ok(ev));
                        }
                        if let Some(ev) = self.idleness_event() {
                            return Poll::Ready(Ok(ev));
                        }
                        continue 'scan;
                    }
                    Poll::Ready(None) => {
                        return Poll::Ready(Err(Error::ChannelClosed(
                            "an upstream subtask stopped without end of stream".into(),
                        )))
                    }
                }
            }
            return Poll::Pending;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn barrier(id: u64) -> StreamElement<u32> {
        StreamElement::Barrier(Barrier {
            checkpoint_id: id,
            timestamp_ms: 0,
            is_final: false,
        })
    }

    #[tokio::test]
    async fn alignment_holds_back_the_input_that_delivered_the_barrier() {
        let (tx0, rx0) = mpsc::channel(16);
        let (tx1, rx1) = mpsc::channel(16);
        let mut gate = InputGate::new(vec![
            Box::new(DirectReceiver(rx0)) as Box<dyn InputReceiver<u32>>,
            Box::new(DirectReceiver(rx1)),
        ]);
        // fast input 0: pre-barrier data, barrier 1, lots of post-barrier data
        tx0.send(StreamElement::Records(vec![1, 2])).await.unwrap();
        tx0.send(barrier(1)).await.unwrap();
        for i in 0..10 {
            tx0.send(StreamElement::Records(vec![100 + i]))
                .await
                .unwrap();
        }
        // slow input 1: nothing yet
        let mut seen = Vec::new();
        while let Some(ev) = gate.next().now_or_never() {
            match ev.unwrap() {
                GateEvent::Records(v) => seen.extend(v),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(
            seen,
            vec![1, 2],
            "post-barrier records of input 0 must wait"
        );
        assert!(gate.is_blocked(0));
        tx1.send(StreamElement::Records(vec![50])).await.unwrap();
        assert!(matches!(gate.next().await.unwrap(), GateEvent::Records(v) if v == vec![50]));
        tx1.send(barrier(1)).await.unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Barrier { barrier, .. } => assert_eq!(barrier.checkpoint_id, 1),
            other => panic!("expected the aligned barrier, got {other:?}"),
        }
        assert!(!gate.is_blocked(0));
        assert!(matches!(gate.next().await.unwrap(), GateEvent::Records(v) if v == vec![100]));
    }

    #[tokio::test]
    async fn watermark_is_the_minimum_over_inputs() {
        let (tx0, rx0) = mpsc::channel(16);
        let (tx1, rx1) = mpsc::channel(16);
        let mut gate = InputGate::new(vec![
            Box::new(DirectReceiver(rx0)) as Box<dyn InputReceiver<u32>>,
            Box::new(DirectReceiver(rx1)),
        ]);
        tx0.send(StreamElement::Watermark(Watermark(10)))
            .await
            .unwrap();
        assert!(gate.next().now_or_never().is_none());
        tx1.send(StreamElement::Watermark(Watermark(5)))
            .await
            .unwrap();
        assert!(matches!(
            gate.next().await.unwrap(),
            GateEvent::Watermark(Watermark(5))
        ));
        tx1.send(StreamElement::EndOfStream).await.unwrap();
        assert!(matches!(
            gate.next().await.unwrap(),
            GateEvent::Watermark(Watermark(10))
        ));
        tx0.send(StreamElement::EndOfStream).await.unwrap();
        assert!(matches!(gate.next().await.unwrap(), GateEvent::End));
    }

    /// (event time) An idle input leaves the minimum; once all are idle the gate says so.
    #[tokio::test]
    async fn idle_inputs_do_not_hold_the_watermark_back() {
        let (tx0, rx0) = mpsc::channel(16);
        let (tx1, rx1) = mpsc::channel(16);
        let mut gate = InputGate::new(vec![
            Box::new(DirectReceiver(rx0)) as Box<dyn InputReceiver<u32>>,
            Box::new(DirectReceiver(rx1)),
        ]);
        tx0.send(StreamElement::Watermark(Watermark(50)))
            .await
            .unwrap();
        tx1.send(StreamElement::Watermark(Watermark(5)))
            .await
            .unwrap();
        assert!(matches!(
            gate.next().await.unwrap(),
            GateEvent::Watermark(Watermark(5))
        ));
        tx1.send(StreamElement::Idleness(true)).await.unwrap();
        assert!(matches!(
            gate.next().await.unwrap(),
            GateEvent::Watermark(Watermark(50))
        ));
        tx0.send(StreamElement::Idleness(true)).await.unwrap();
        assert!(matches!(
            gate.next().await.unwrap(),
            GateEvent::Idleness(true)
        ));
        tx1.send(StreamElement::Idleness(false)).await.unwrap();
        assert!(matches!(
            gate.next().await.unwrap(),
            GateEvent::Idleness(false)
        ));
        // input 1 is behind (5): the watermark does not go back, and waits for it
        tx0.send(StreamElement::Idleness(false)).await.unwrap();
        tx0.send(StreamElement::Watermark(Watermark(80)))
            .await
            .unwrap();
        tx1.send(StreamElement::Watermark(Watermark(60)))
            .await
            .unwrap();
        assert!(matches!(
            gate.next().await.unwrap(),
            GateEvent::Watermark(Watermark(60))
        ));
    }
}
