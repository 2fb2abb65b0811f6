//! The switch: the served generation stops at its last commit, the caught-up build
//! passes that position and is recorded and served instead; the old one is retired.

use std::time::Duration;

use super::build::stopped;
use super::{blocking, Build, Generations, STOP_GRACE};
use crate::generation::store_status;
use crate::EngineError;
use replication::BootstrapIntent;
use service::SyncService;
use source::format_lsn;
use status::{unix_now, DeployDone, DeployPhase, Phase, ReplicationStatus};

/// How long a switch waits for the new generation to reach the old one's last position.
const SWITCH_WAIT: Duration = Duration::from_secs(60);

impl Generations {
    /// Replaces the served generation with the caught-up build: the old one stops at its
    /// last commit, the build passes that position, the storage records the new one as
    /// served, the endpoints switch over, and the old one is retired. If any step fails
    /// the old generation resumes as it was and the build fails.
    pub async fn switch(&mut self, sync: &SyncService) {
        let Some(mut build) = self.build.take() else {
            return;
        };
        let intent = match build
            .generation
            .store
            .read(|view| Ok(BootstrapIntent::load(view)))
        {
            Ok(Ok(Some(intent))) => intent,
            Ok(Ok(None)) => return self.resume_served(build, stopped()),
            Ok(Err(e)) => return self.resume_served(build, e.into()),
            Err(e) => return self.resume_served(build, e.into()),
        };
        self.status.update(|s| {
            if let Some(d) = s.deploy.as_mut() {
                d.phase = DeployPhase::Switching;
            }
        });
        self.active.stop(STOP_GRACE).await;
        if let Err(e) = self.hand_over(&mut build, sync).await {
            self.active.start(self.status.clone());
            return self.resume_served(build, e);
        }
        build.generation.serve();
        let new = &build.generation;
        let seconds = build.started.elapsed().as_secs_f64();
        let (number, rows) = (new.number, intent.rows);
        let tables = new.rules.tables().len() as u64;
        let replication = ReplicationStatus {
            slot: new.plan.slot.clone(),
            consistent_point: intent.consistent_point.map(format_lsn),
            tables_total: tables,
            tables_done: tables,
            rows,
            ..ReplicationStatus::default()
        };
        let (rules_hash, store) = (new.rules.content_hash_hex(), store_status(&new.store));
        self.status.update(|s| {
            s.phase = Phase::Streaming;
            s.ready = true;
            s.generation = Some(number);
            s.rules_hash = Some(rules_hash);
            s.store = Some(store);
            s.replication = Some(replication);
            s.deploy = None;
            s.last_deploy = Some(DeployDone {
                generation: number,
                seconds,
                rows,
                switched_at: unix_now(),
            });
        });
        tracing::info!(
            generation = number,
            seconds = format!("{seconds:.1}"),
            "rules deploy switched over; retiring the previous generation"
        );
        let old = std::mem::replace(&mut self.active, build.generation);
        self.retire(old);
    }

    /// The switch proper, with the served generation stopped: the build passes its last
    /// position, `active` names the build, the endpoints serve it. On an error nothing of
    /// this stays (`active` names the served generation again).
    async fn hand_over(&self, build: &mut Build, sync: &SyncService) -> Result<(), EngineError> {
        let old_lsn = self.active.checkpoint().lsn;
        let mut checkpoints = build.generation.checkpoints();
        let reached = tokio::select! {
            r = tokio::time::timeout(SWITCH_WAIT, checkpoints.wait_for(|c| c.lsn >= old_lsn)) => {
                matches!(r, Ok(Ok(_)))
            }
            ended = build.generation.replication_ended() => ended.and(Err(stopped()))?,
        };
        if !reached {
            return Err(EngineError::Deploy(format!(
                "PSM_D2001 the new generation did not reach the served one's position {} within \
                 {SWITCH_WAIT:?}",
                format_lsn(old_lsn)
            )));
        }
        let (root, dir) = (self.root.clone(), build.generation.dir().to_owned());
        blocking(move || store::set_active(&root, &dir)).await?;
        if let Err(e) = sync.switch_to(build.generation.served()).await {
            let (root, served) = (self.root.clone(), self.active.dir().to_owned());
            let restored = blocking(move || {
                if served == root {
                    store::remove_active_file(&root)
                } else {
                    store::set_active(&root, &served)
                }
            })
            .await;
            if let Err(restore) = restored {
                // `active` names the build: a restart would serve it, complete and
                // caught up, which is correct; only this process keeps the old one.
                tracing::warn!("{restore}; the storage records the new generation as served");
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Fails `build` with `error` while the served generation stays.
    fn resume_served(&mut self, build: Build, error: EngineError) {
        self.build = Some(build);
        self.fail_build(&error);
    }
}
