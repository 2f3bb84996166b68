//! The async group coordinator: every group's state machine behind one mutex, oneshot
//! channels for JoinGroup / SyncGroup requests that wait, a tokio timer task for session and
//! rebalance timeouts, the offsets store, and metrics.
//!
//! The mutex is never held across an `.await` or a blocking fsync: waiting requests park on
//! their oneshot receiver, and offset commits are written on the blocking pool.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use tokio::sync::oneshot;

use super::machine::{
    Group, GroupState, JoinParams, JoinResult, Reply, SyncResult, WaiterId, NONE,
};
use super::offsets::{CommittedOffset, OffsetStore, TopicPartition};
use super::{ErrorCode, GroupConfig, Result};

/// How often the timer forces offsets written without fsync to disk.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Name of the directory under the broker's data directory that holds the group offsets.
pub const OFFSETS_DIR: &str = "__group_offsets";

enum Waiter {
    Join(oneshot::Sender<JoinResult>),
    Sync(oneshot::Sender<SyncResult>),
}

#[derive(Default)]
struct Inner {
    groups: HashMap<String, Group>,
    waiters: HashMap<WaiterId, Waiter>,
    /// Last generation written to the offsets store, per group.
    persisted_generation: HashMap<String, i32>,
}

/// One member as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberDescription {
    /// Member id.
    pub member_id: String,
    /// Static membership id.
    pub group_instance_id: Option<String>,
    /// The client's `client.id`.
    pub client_id: String,
    /// The client's address.
    pub client_host: String,
    /// Metadata for the selected protocol (Stable groups only, else empty).
    pub metadata: Bytes,
    /// The member's assignment (Stable groups only, else empty).
    pub assignment: Bytes,
}

/// A group as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDescription {
    /// Group id.
    pub group_id: String,
    /// State (`Dead` for an unknown group).
    pub state: GroupState,
    /// Protocol type, or empty.
    pub protocol_type: String,
    /// Selected protocol when Stable, or empty.
    pub protocol: String,
    /// Members.
    pub members: Vec<MemberDescription>,
}

/// A group as ListGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroupInfo {
    /// Group id.
    pub group_id: String,
    /// Protocol type, or empty.
    pub protocol_type: String,
    /// State.
    pub state: GroupState,
}

/// One partition of an OffsetFetch answer.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchedOffset {
    /// The partition.
    pub partition: TopicPartition,
    /// Error code (UNSTABLE_OFFSET_COMMIT while transactional offsets are pending).
    pub error: ErrorCode,
    /// The committed offset, if any.
    pub committed: Option<CommittedOffset>,
}

/// The group coordinator of this broker (it answers for every group).
pub struct GroupCoordinator {
    inner: Mutex<Inner>,
    offsets: OffsetStore,
    config: GroupConfig,
    started: Instant,
    next_waiter: AtomicU64,
    nonce: u64,
    /// Set at shutdown: JoinGroup / SyncGroup are refused and waiting ones released.
    closing: AtomicBool,
    closed: AtomicBool,
}

impl std::fmt::Debug for GroupCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCoordinator")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl GroupCoordinator {
    /// Opens the coordinator. With a data directory the offsets live in
    /// `data_dir/__group_offsets/offsets.log` and are recovered from it; without one they are
    /// kept in memory. `fsync_every_write` makes each commit durable before it is answered.
    pub fn open(
        data_dir: Option<&Path>,
        fsync_every_write: bool,
        config: GroupConfig,
    ) -> Result<Self> {
        let offsets = match data_dir {
            Some(dir) => OffsetStore::open_with_repair(
                &dir.join(OFFSETS_DIR),
                fsync_every_write,
                config.repair_corrupt_logs,
            )?,
            None => OffsetStore::in_memory(),
        };
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id()).rotate_left(32);
        let mut inner = Inner::default();
        for (group, generation, protocol_type) in offsets.generations() {
            inner.persisted_generation.insert(group.clone(), generation);
            let restored = Group::restored(
                &group,
                config.clone(),
                nonce,
                generation,
                Some(protocol_type),
            );
            inner.groups.insert(group, restored);
        }
        for group in offsets.groups_with_offsets() {
            inner
                .groups
                .entry(group.clone())
                .or_insert_with(|| Group::new(&group, config.clone(), nonce));
        }
        Ok(Self {
            inner: Mutex::new(inner),
            offsets,
            config,
            started: Instant::now(),
            next_waiter: AtomicU64::new(1),
            nonce,
            closing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        })
    }

    /// A coordinator that keeps everything in memory.
    pub fn in_memory(config: GroupConfig) -> Self {
        match Self::open(None, false, config.clone()) {
            Ok(c) => c,
            // Opening without a directory performs no I/O and cannot fail.
            Err(_) => unreachable!("in-memory group coordinator failed to open"),
        }
    }

    /// The offsets store (the transaction coordinator stages and completes transactional
    /// offsets through it).
    pub fn offsets(&self) -> &OffsetStore {
        &self.offsets
    }

    /// The configuration.
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_group(&self, group_id: &str) -> Group {
        Group::new(group_id, self.config.clone(), self.nonce)
    }

    /// Starts the timer task that expires members and enforces rebalance timeouts. It stops
    /// when the coordinator is dropped or closed.
    pub fn spawn_timer(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let every = self.config.tick_interval;
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_sync = Instant::now();
            loop {
                interval.tick().await;
                let Some(coordinator) = weak.upgrade() else {
                    break;
                };
                if coordinator.closed.load(Ordering::Acquire) {
                    break;
                }
                coordinator.tick();
                if last_sync.elapsed() >= SYNC_INTERVAL {
                    last_sync = Instant::now();
                    let store = coordinator.offsets.clone();
                    drop(coordinator);
                    let synced = tokio::task::spawn_blocking(move || store.sync_if_dirty()).await;
                    if let Ok(Err(e)) = synced {
                        tracing::warn!(error = %e, "syncing group offsets failed");
                    }
                }
            }
        })
    }

    /// One pass of the timers over every group.
    pub fn tick(&self) {
        let now = self.now_ms();
        let mut inner = self.lock();
        let ids: Vec<String> = inner
            .groups
            .iter()
            .filter(|(_, g)| g.next_deadline().is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let Some(group) = inner.groups.get_mut(&id) else {
                continue;
            };
            let (replies, _expired) = group.tick(now);
            self.after_change(&mut inner, &id, replies);
        }
    }

    /// Delivers replies, persists a new generation, and updates metrics for `group_id`.
    fn after_change(&self, inner: &mut Inner, group_id: &str, replies: Vec<Reply>) {
        for reply in replies {
            match reply {
                Reply::Join { waiter, result } => {
                    if let Some(Waiter::Join(tx)) = inner.waiters.remove(&waiter) {
                        let _ = tx.send(result);
                    }
                }
                Reply::Sync { waiter, result } => {
                    if let Some(Waiter::Sync(tx)) = inner.waiters.remove(&waiter) {
                        let _ = tx.send(result);
                    }
                }
            }
        }
        let Some(group) = inner.groups.get(group_id) else {
            return;
        };
        metrics::gauge!("onceflow_broker_group_members", "group" => group_id.to_owned())
            .set(group.members().len() as f64);
        let generation = group.generation();
        if inner.persisted_generation.get(group_id) != Some(&generation) {
            let protocol_type = group.protocol_type().unwrap_or("").to_owned();
            match self
                .offsets
                .record_generation(group_id, generation, &protocol_type)
            {
                Ok(()) => {
                    inner
                        .persisted_generation
                        .insert(group_id.to_owned(), generation);
                }
                Err(e) => {
                    tracing::warn!(group = %group_id, error = %e, "could not record group generation");
                }
            }
        }
    }

    fn register(&self, inner: &mut Inner, waiter: Waiter) -> WaiterId {
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        inner.waiters.insert(id, waiter);
        id
    }

    /// JoinGroup: waits until the rebalance completes (or answers at once on error or for
    /// MEMBER_ID_REQUIRED).
    pub async fn join(&self, group_id: &str, params: JoinParams) -> JoinResult {
        let member_id = params.member_id.clone();
        if group_id.is_empty() {
            return JoinResult::error(&member_id, ResponseError::InvalidGroupId.code());
        }
        if !Group::session_timeout_valid(&self.config, params.session_timeout_ms) {
            return JoinResult::error(&member_id, ResponseError::InvalidSessionTimeout.code());
        }
        let (tx, rx) = oneshot::channel();
        {
            let now = self.now_ms();
            let mut inner = self.lock();
            // Checked under the lock so that a request is either refused here or registered
            // before `begin_shutdown` drains the waiters.
            if self.closing.load(Ordering::Acquire) {
                return JoinResult::error(&member_id, ResponseError::NotCoordinator.code());
            }
            if !inner.groups.contains_key(group_id) {
                if !member_id.is_empty() {
                    return JoinResult::error(&member_id, ResponseError::UnknownMemberId.code());
                }
                let group = self.new_group(group_id);
                inner.groups.insert(group_id.to_owned(), group);
            }
            let waiter = self.register(&mut inner, Waiter::Join(tx));
            let replies = match inner.groups.get_mut(group_id) {
                Some(group) => group.join(waiter, params, now),
                None => Vec::new(),
            };
            self.after_change(&mut inner, group_id, replies);
        }
        rx.await.unwrap_or_else(|_| {
            JoinResult::error(&member_id, ResponseError::CoordinatorNotAvailable.code())
        })
    }

    /// SyncGroup: the leader brings the assignment; everyone waits for it.
    pub async fn sync(
        &self,
        group_id: &str,
        generation_id: i32,
        member_id: &str,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncResult {
        if group_id.is_empty() {
            return SyncResult::error(ResponseError::InvalidGroupId.code());
        }
        let (tx, rx) = oneshot::channel();
        {
            let now = self.now_ms();
            let mut inner = self.lock();
            if self.closing.load(Ordering::Acquire) {
                return SyncResult::error(ResponseError::NotCoordinator.code());
            }
            if !inner.groups.contains_key(group_id) {
                return SyncResult::error(ResponseError::UnknownMemberId.code());
            }
            let waiter = self.register(&mut inner, Waiter::Sync(tx));
            let replies = match inner.groups.get_mut(group_id) {
                Some(group) => group.sync(
                    waiter,
                    generation_id,
                    member_id,
                    protocol_type,
                    protocol_name,
                    assignments,
                    now,
                ),
                None => Vec::new(),
            };
            self.after_change(&mut inner, group_id, replies);
        }
        rx.await
            .unwrap_or_else(|_| SyncResult::error(ResponseError::CoordinatorNotAvailable.code()))
    }

    /// Heartbeat.
    pub fn heartbeat(&self, group_id: &str, generation_id: i32, member_id: &str) -> ErrorCode {
        if group_id.is_empty() {
            return ResponseError::InvalidGroupId.code();
        }
        let now = self.now_ms();
        let mut inner = self.lock();
        match inner.groups.get_mut(group_id) {
            Some(group) => group.heartbeat(generation_id, member_id, now),
            None => ResponseError::UnknownMemberId.code(),
        }
    }

    /// LeaveGroup for one or more members: a top-level error and one error per member.
    pub fn leave(&self, group_id: &str, member_ids: &[String]) -> (ErrorCode, Vec<ErrorCode>) {
        if group_id.is_empty() {
            return (ResponseError::InvalidGroupId.code(), Vec::new());
        }
        let now = self.now_ms();
        let mut inner = self.lock();
        let Some(group) = inner.groups.get_mut(group_id) else {
            let unknown = ResponseError::UnknownMemberId.code();
            return (NONE, member_ids.iter().map(|_| unknown).collect());
        };
        if group.state() == GroupState::Dead {
            return (ResponseError::CoordinatorNotAvailable.code(), Vec::new());
        }
        let (errors, replies) = group.leave(member_ids, now);
        self.after_change(&mut inner, group_id, replies);
        (NONE, errors)
    }

    /// The member and generation checks of OffsetCommit / TxnOffsetCommit for `group_id`
    /// (a group that does not exist yet is created when `generation_id` < 0 or the commit is
    /// transactional, as Kafka does).
    pub fn validate_commit(
        &self,
        group_id: &str,
        generation_id: i32,
        member_id: &str,
        transactional: bool,
    ) -> ErrorCode {
        if group_id.is_empty() {
            return ResponseError::InvalidGroupId.code();
        }
        if self.closed.load(Ordering::Acquire) {
            return ResponseError::CoordinatorNotAvailable.code();
        }
        let now = self.now_ms();
        let mut inner = self.lock();
        if !inner.groups.contains_key(group_id) {
            if generation_id >= 0 && !transactional {
                return ResponseError::IllegalGeneration.code();
            }
            let group = self.new_group(group_id);
            inner.groups.insert(group_id.to_owned(), group);
        }
        match inner.groups.get_mut(group_id) {
            Some(group) => {
                group.validate_offset_commit(generation_id, member_id, transactional, now)
            }
            None => ResponseError::CoordinatorNotAvailable.code(),
        }
    }

    /// OffsetCommit: checks the member, then writes the offsets (on the blocking pool).
    /// Returns one error code per entry, in order.
    pub async fn commit_offsets(
        &self,
        group_id: &str,
        generation_id: i32,
        member_id: &str,
        offsets: Vec<(TopicPartition, CommittedOffset)>,
    ) -> Vec<ErrorCode> {
        let error = self.validate_commit(group_id, generation_id, member_id, false);
        if error != NONE {
            return vec![error; offsets.len()];
        }
        let too_large = ResponseError::OffsetMetadataTooLarge.code();
        let codes: Vec<ErrorCode> = offsets
            .iter()
            .map(|(_, c)| {
                if c.metadata.len() > self.config.max_metadata_bytes {
                    too_large
                } else {
                    NONE
                }
            })
            .collect();
        let accepted: Vec<(TopicPartition, CommittedOffset)> = offsets
            .into_iter()
            .zip(&codes)
            .filter(|(_, code)| **code == NONE)
            .map(|(entry, _)| entry)
            .collect();
        let store = self.offsets.clone();
        let group = group_id.to_owned();
        let written = tokio::task::spawn_blocking(move || store.commit(&group, accepted)).await;
        let failure = match written {
            Ok(Ok(())) => NONE,
            Ok(Err(e)) => {
                tracing::error!(group = %group_id, error = %e, "writing committed offsets failed");
                ResponseError::NotCoordinator.code()
            }
            Err(e) => {
                tracing::error!(group = %group_id, error = %e, "offset commit task failed");
                ResponseError::CoordinatorNotAvailable.code()
            }
        };
        codes
            .into_iter()
            .map(|code| if code == NONE { failure } else { code })
            .collect()
    }

    /// OffsetFetch for `partitions` (None = every committed partition of the group).
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<Vec<TopicPartition>>,
        require_stable: bool,
    ) -> Vec<FetchedOffset> {
        let partitions = match partitions {
            Some(p) => p,
            None => self
                .offsets
                .group_offsets(group_id)
                .into_iter()
                .map(|(tp, _)| tp)
                .collect(),
        };
        partitions
            .into_iter()
            .map(|tp| {
                if require_stable && self.offsets.has_pending(group_id, &tp.topic, tp.partition) {
                    FetchedOffset {
                        partition: tp,
                        error: ResponseError::UnstableOffsetCommit.code(),
                        committed: None,
                    }
                } else {
                    let committed = self.offsets.fetch(group_id, &tp);
                    FetchedOffset {
                        partition: tp,
                        error: NONE,
                        committed,
                    }
                }
            })
            .collect()
    }

    /// DescribeGroups for one group.
    pub fn describe(&self, group_id: &str) -> GroupDescription {
        let inner = self.lock();
        let Some(group) = inner.groups.get(group_id) else {
            return GroupDescription {
                group_id: group_id.to_owned(),
                state: GroupState::Dead,
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            };
        };
        let stable = group.state() == GroupState::Stable;
        let protocol = if stable {
            group.protocol_name().unwrap_or("").to_owned()
        } else {
            String::new()
        };
        let members = group
            .members()
            .iter()
            .map(|m| MemberDescription {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: if stable {
                    m.metadata(&protocol).cloned().unwrap_or_default()
                } else {
                    Bytes::new()
                },
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    Bytes::new()
                },
            })
            .collect();
        GroupDescription {
            group_id: group_id.to_owned(),
            state: group.state(),
            protocol_type: group.protocol_type().unwrap_or("").to_owned(),
            protocol,
            members,
        }
    }

    /// ListGroups, optionally only groups in `states` (Kafka state names, case-insensitive).
    pub fn list(&self, states: &[String]) -> Vec<ListedGroupInfo> {
        let inner = self.lock();
        let mut out: Vec<ListedGroupInfo> = inner
            .groups
            .values()
            .filter(|g| {
                states.is_empty()
                    || states
                        .iter()
                        .any(|s| s.eq_ignore_ascii_case(g.state().as_str()))
            })
            .map(|g| ListedGroupInfo {
                group_id: g.id().to_owned(),
                protocol_type: g.protocol_type().unwrap_or("").to_owned(),
                state: g.state(),
            })
            .collect();
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// First step of a broker shutdown: refuses new JoinGroup / SyncGroup requests and answers
    /// the waiting ones with NOT_COORDINATOR (as Kafka does when a coordinator unloads a group),
    /// so that connections parked in a rebalance can finish. Offset commits still work.
    pub fn begin_shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        let mut inner = self.lock();
        let code = ResponseError::NotCoordinator.code();
        for (_, waiter) in inner.waiters.drain() {
            match waiter {
                Waiter::Join(tx) => {
                    let _ = tx.send(JoinResult::error("", code));
                }
                Waiter::Sync(tx) => {
                    let _ = tx.send(SyncResult::error(code));
                }
            }
        }
    }

    /// Stops the timer, releases waiting requests, and syncs and closes the offsets store
    /// (the end of a broker shutdown).
    pub fn close(&self) {
        self.begin_shutdown();
        self.closed.store(true, Ordering::Release);
        if let Err(e) = self.offsets.close() {
            tracing::warn!(error = %e, "syncing group offsets at shutdown failed");
        }
    }
}
