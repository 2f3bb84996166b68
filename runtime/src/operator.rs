//! The operator trait: what the runtime calls for one subtask. The runtime owns alignment,
//! barriers and acknowledgements; operators only implement hooks (no-op by default).

use crate::connector::SubtaskInfo;
use crate::element::{CheckpointId, Watermark};
use crate::state::{OperatorSnapshot, RestoredState, StateChange};
use crate::Result;

/// One subtask of a one-input operator (two-input operators take [`crate::TwoInputs`]).
pub trait Operator<In, Out>: Send + 'static {
    /// Called once before any other hook, after `restore`.
    fn open(&mut self, _info: &SubtaskInfo) -> Result<()> {
        Ok(())
    }

    /// Restores state from a checkpoint (already re-sliced to this subtask's key groups).
    fn restore(&mut self, _state: RestoredState) -> Result<()> {
        Ok(())
    }

    /// Processes one record, appending outputs to `out`.
    fn process(&mut self, record: In, out: &mut Vec<Out>) -> Result<()>;

    /// The input watermark advanced to `wm` (minimum over inputs). Returns the watermark to
    /// forward downstream (by default `wm` itself).
    fn handle_watermark(
        &mut self,
        wm: Watermark,
        _out: &mut Vec<Out>,
    ) -> Result<Option<Watermark>> {
        Ok(Some(wm))
    }

    /// The next moment this subtask wants [`Operator::on_processing_time`] called (e.g. the
    /// earliest processing-time timer); asked after every event. `None`: no wake-up.
    fn processing_deadline(&self) -> Option<std::time::Instant> {
        None
    }

    /// Called once the deadline from [`Operator::processing_deadline`] has passed.
    fn on_processing_time(&mut self, _now: std::time::Instant, _out: &mut Vec<Out>) -> Result<()> {
        Ok(())
    }

    /// Snapshots state for checkpoint `checkpoint`; called when every input has delivered its
    /// barrier and before the barrier is forwarded. An error fails the checkpoint, not the job.
    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<OperatorSnapshot> {
        Ok(OperatorSnapshot::default())
    }

    /// Checkpoint `checkpoint` is complete.
    fn handle_commit(&mut self, _checkpoint: CheckpointId) -> Result<()> {
        Ok(())
    }

    /// Every input ended; emit anything still held.
    fn finish(&mut self, _out: &mut Vec<Out>) -> Result<()> {
        Ok(())
    }

    /// Entries of keyed state held (for the state-size metric).
    fn state_entries(&self) -> usize {
        0
    }

    /// The job writes a changelog of keyed state: start recording which keys change. Called
    /// once, before `restore`. Keyed operators forward it to their
    /// [`crate::state::KeyedStateStore::track_changes`].
    fn track_state_changes(&mut self) {}

    /// The keyed state changes since the previous call (see
    /// [`crate::state::KeyedStateStore::take_changes`]); called at each aligned barrier after
    /// [`Operator::snapshot`] when the job writes a changelog. `None`: the operator holds no
    /// keyed state.
    fn take_state_changes(&mut self) -> Result<Option<Vec<StateChange>>> {
        Ok(None)
    }
}
