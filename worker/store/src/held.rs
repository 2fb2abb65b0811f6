//! A write kept open across writes: what clients read stays the last commit while many
//! writes go into one MDBX transaction, and all of them become visible (and durable)
//! together when it is released — or none, when it is abandoned or the process dies.
//!
//! A table's re-copy after a schema change and a rebuild from a new slot use it: each
//! spans many of the store's writes, and a client must never read a state between them
//! (`docs/correctness.md`, "Whole checkpoints"). Readers are MVCC readers: a read started
//! during the hold sees the last commit before it. Every write takes the same gate
//! ([`Opened::gate`](super::Opened)): while a write is held, the writes of others (a
//! write-checkpoint request) go into it too, and those stage records are written again on
//! their own if the hold is abandoned, so none is lost.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use libmdbx::RW;

use crate::changes::Changes;
use crate::checkpoint::Checkpoint;
use crate::compress::RecordCodec;
use crate::env::OwnedTxn;
use crate::error::StoreError;
use crate::Store;

/// The write transaction a hold keeps open, and what its writes did so far.
pub(crate) struct Held {
    /// Borrows the environment of the [`Opened`](super::Opened) it lives in, which drops
    /// it before the environment (see there).
    pub txn: OwnedTxn<'static, RW>,
    /// The checkpoint its last write made.
    pub checkpoint: Checkpoint,
    /// What its writes changed, recorded for the wakeups when it is released.
    pub changes: Changes,
    /// How records were packed before it: a dictionary it trained goes if it is abandoned.
    pub codec_before: Arc<RecordCodec>,
    /// Stage records written into it besides the held writes' own (write-checkpoint
    /// requests), written again on their own if it is abandoned.
    pub stage_records: Vec<(String, Vec<u8>)>,
}

impl Held {
    /// A hold of `txn`, whose writes so far made `checkpoint` and changed `changes`.
    pub fn new(
        txn: OwnedTxn<'_, RW>,
        checkpoint: Checkpoint,
        changes: Changes,
        codec_before: Arc<RecordCodec>,
    ) -> Self {
        // SAFETY: the transaction borrows the environment in the same `Opened`, which
        // keeps it in a field declared before the environment's: it is aborted or
        // committed before the environment closes, and nothing reopens the environment
        // while it is held (`Store::write_through_map` leaves it as it is then).
        let txn = unsafe { std::mem::transmute::<OwnedTxn<'_, RW>, OwnedTxn<'static, RW>>(txn) };
        Self {
            txn,
            checkpoint,
            changes,
            codec_before,
            stage_records: Vec::new(),
        }
    }
}

impl Store {
    /// Starts holding: the writes from now on go into one transaction that clients do
    /// not see until [`Self::release`]. Holding already, nothing changes.
    pub fn hold(&self) -> Result<(), StoreError> {
        self.refuse_if_poisoned()?;
        let opened = self.opened()?;
        let mut gate = opened.gate.lock();
        if gate.is_some() {
            return Ok(());
        }
        // No write commits while the gate is held: this is the checkpoint the hold starts at.
        let checkpoint = self.read(|view| view.checkpoint())?;
        let txn = opened
            .env
            .begin_rw_txn()
            .map_err(|e| StoreError::mdbx(&self.dir, "begin a held write", e))?;
        let codec = self.codec.read().clone();
        *gate = Some(Held::new(txn, checkpoint, Changes::default(), codec));
        self.held.store(true, Ordering::Release);
        Ok(())
    }

    /// True while writes are held ([`Self::hold`], [`crate::WriteTxn::hold_open`]).
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Commits the held writes durably: clients see all of them at once. Returns the
    /// checkpoint the last of them made (`None` when nothing was held).
    pub fn release(&self) -> Result<Option<Checkpoint>, StoreError> {
        let opened = self.opened()?;
        let mut gate = opened.gate.lock();
        let Some(held) = gate.take() else {
            return Ok(None);
        };
        self.held.store(false, Ordering::Release);
        if let Err(e) = held.txn.commit() {
            self.poisoned.store(true, Ordering::Release);
            return Err(StoreError::mdbx(&self.dir, "commit the held writes", e));
        }
        drop(gate);
        drop(opened);
        self.changes.record(held.changes);
        self.sync()?;
        Ok(Some(held.checkpoint))
    }

    /// Drops the held writes: the store stays as its last commit before the hold. Stage
    /// records others wrote into the hold are written again on their own.
    pub fn abandon(&self) -> Result<(), StoreError> {
        let opened = self.opened()?;
        let mut gate = opened.gate.lock();
        let records = self.abandon_held(gate.take());
        drop(gate);
        drop(opened);
        if records.is_empty() {
            return Ok(());
        }
        self.put_stage_records(&records)
    }

    /// Aborts `held` (the caller holds the gate); returns the stage records to write again.
    pub(crate) fn abandon_held(&self, held: Option<Held>) -> Vec<(String, Vec<u8>)> {
        let Some(held) = held else {
            return Vec::new();
        };
        self.held.store(false, Ordering::Release);
        let Held {
            txn,
            codec_before,
            stage_records,
            ..
        } = held;
        drop(txn);
        *self.codec.write() = codec_before;
        tracing::debug!(dir = %self.dir.display(), "held writes abandoned");
        stage_records
    }
}
