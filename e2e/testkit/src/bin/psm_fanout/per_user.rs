//! `per-user`: streams of distinct users, each holding its own routed bucket, while
//! single-row commits arrive at a fixed rate, each touching one random user's row (every
//! user once per round, in a new random order each round). Every
//! commit writes a marker (`<prefix><seq>`) into the row; the stream whose `data` line
//! carries it ends that commit's wait at its next `checkpoint_complete`. Each commit is
//! timed from its `COMMIT` returning to the client until then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::conn::{Event, Target};
use crate::flags::{Common, Flags};
use crate::open::merge;
use crate::stats::{round, summary, Cpu};
use crate::streams::Streams;

/// The scenario's own settings.
pub struct PerUser {
    /// libpq connection string of the primary.
    pub primary: String,
    /// Commits per second.
    pub rate: f64,
    /// For how long commits are issued.
    pub seconds: f64,
    /// Connections to the primary the commits are spread over.
    pub connections: usize,
    /// The commit: `$1` the marker, `$2` the user id.
    pub sql: String,
    /// How long after the last commit its checkpoint may take.
    pub settle: Duration,
    /// Seeds the choice of users.
    pub seed: u64,
}

/// The marker prefix written by commits and looked for in `data` lines.
pub const MARKER: &str = "fanout-";

impl PerUser {
    /// Reads the flags of `per-user`.
    pub fn from_flags(flags: &mut Flags) -> Result<Self, String> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Ok(Self {
            primary: flags
                .take("--primary")
                .ok_or("per-user needs --primary <connection string>")?,
            rate: flags.parsed("--rate")?.unwrap_or(1000.0),
            seconds: flags.parsed("--seconds")?.unwrap_or(20.0),
            connections: flags.parsed("--pg-connections")?.unwrap_or(16),
            sql: flags
                .take("--commit-sql")
                .unwrap_or_else(|| "UPDATE notes SET body = $1 WHERE owner = $2".into()),
            settle: Duration::from_secs_f64(flags.parsed("--settle-seconds")?.unwrap_or(30.0)),
            seed: flags.parsed("--seed")?.unwrap_or(seed),
        })
    }

    /// Runs the scenario and returns its report.
    pub async fn run(self, common: &Common, target: Target) -> serde_json::Value {
        let (mut streams, opening) = Streams::open(common, target).await;
        let mut report = streams.report(&opening);
        merge(
            &mut report,
            serde_json::json!({"scenario": "per-user", "coding": common.coding}),
        );
        eprintln!(
            "psm-fanout: {} of {} streams opened in {:.2} s; {} commits/s for {} s",
            streams.opened(),
            common.streams,
            opening.seconds,
            self.rate,
            self.seconds
        );
        streams
            .drain_until(Instant::now() + Duration::from_secs(1))
            .await;
        let total = (self.rate * self.seconds).round() as usize;
        let users = schedule(self.seed, total, common.streams);
        let mut by_user = vec![Vec::new(); common.streams];
        for (seq, &user) in users.iter().enumerate() {
            by_user[user].push(seq as u64);
        }
        let mut commits = vec![Commit::default(); total];
        let (tx, returned) = unbounded_channel();
        let plan = Arc::new(Plan {
            users,
            rate: self.rate,
            sql: self.sql.clone(),
            names: (0..common.streams).map(|i| common.user(i)).collect(),
        });
        let cpu = Cpu::now(common.worker_pid);
        let commits_thread = {
            let (plan, primary) = (plan.clone(), self.primary.clone());
            let connections = self.connections.max(1);
            std::thread::spawn(move || issue_commits(&primary, connections, &plan, &tx))
        };
        let followed = self
            .follow(
                common,
                &mut streams,
                returned,
                &plan,
                &by_user,
                &mut commits,
            )
            .await;
        let cpu = cpu.since();
        let pg_errors = commits_thread
            .join()
            .unwrap_or_else(|_| vec!["the commit thread panicked".into()]);
        let Measured {
            latencies,
            round_trips,
            before_return,
            no_row,
        } = Measured::of(&commits);
        let issued = round_trips.len();
        let first_sent = commits.iter().filter_map(|c| c.sent).min();
        let span = match (first_sent, followed.last_returned) {
            (Some(first), Some(last)) => (last - first).as_secs_f64(),
            _ => 0.0,
        };
        merge(
            &mut report,
            serde_json::json!({
                "commits_planned": total,
                "commits_issued": issued,
                "commit_rate_target": self.rate,
                "commit_rate_achieved": (span > 0.0).then(|| round(issued as f64 / span, 1)),
                "commits_touching_no_row": no_row,
                "commit_round_trip_ms": summary(&round_trips, 3),
                "commits_measured": latencies.len(),
                "commits_unmeasured": issued - latencies.len(),
                "checkpoint_before_commit_returned": before_return,
                "markers_on_another_users_stream": followed.misattributed,
                "commit_to_checkpoint_complete_ms": summary(&latencies, 3),
                "pg_connections": self.connections,
                "pg_errors": pg_errors.into_iter().take(5).collect::<Vec<_>>(),
                "seed": self.seed,
                "commits_phase": cpu,
            }),
        );
        report
    }

    /// Follows the streams while the commits return, until every commit was seen on its
    /// stream or the settle time after the last one passed: stamps each commit's return
    /// and the `checkpoint_complete` that first carried it.
    async fn follow(
        &self,
        common: &Common,
        streams: &mut Streams,
        mut returned: UnboundedReceiver<Returned>,
        plan: &Plan,
        by_user: &[Vec<u64>],
        commits: &mut [Commit],
    ) -> Followed {
        let total = commits.len();
        let mut misattributed = 0usize;
        let mut workers_done = false;
        let mut last_returned: Option<Instant> = None;
        let mut settle_until: Option<Instant> = None;
        let mut seen = 0usize;
        // Only a commit thread that hangs reaches this.
        let give_up = Instant::now() + Duration::from_secs_f64(self.seconds) + common.timeout;
        loop {
            if Instant::now() >= give_up {
                break;
            }
            if workers_done {
                let until = *settle_until.get_or_insert(Instant::now() + self.settle);
                if seen == total || Instant::now() >= until {
                    break;
                }
            }
            let wake = settle_until
                .unwrap_or(Instant::now() + Duration::from_secs(1))
                .min(give_up);
            tokio::select! {
                commit = returned.recv(), if !workers_done => match commit {
                    Some(Returned { seq, sent, at, rows }) => {
                        if let Some(c) = commits.get_mut(seq) {
                            c.sent = Some(sent);
                            c.returned = Some(at);
                            c.rows = rows;
                        }
                        last_returned = last_returned.max(Some(at));
                    }
                    None => workers_done = true,
                },
                event = streams.next_event(wake) => {
                    if let Some(Event::Complete { stream, at, markers }) = event {
                        let Some(&max) = markers.iter().max() else { continue };
                        for &m in &markers {
                            if plan.users.get(m as usize) != Some(&stream) {
                                misattributed += 1;
                            }
                        }
                        // The row as of marker `max` holds every earlier commit of this user.
                        for &seq in by_user.get(stream).map_or(&[][..], |v| &v[..]) {
                            if seq > max {
                                break;
                            }
                            if let Some(c) = commits.get_mut(seq as usize) {
                                if c.seen.is_none() {
                                    c.seen = Some(at);
                                    seen += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        Followed {
            misattributed,
            last_returned,
        }
    }
}

/// What following the streams found.
struct Followed {
    /// Markers that arrived on a stream whose user the commit did not touch.
    misattributed: usize,
    /// When the last commit returned.
    last_returned: Option<Instant>,
}

/// The measured times (in milliseconds) and counts of the commits that returned.
struct Measured {
    /// From each commit's return to the `checkpoint_complete` that carried it.
    latencies: Vec<f64>,
    /// From each commit's send to its return.
    round_trips: Vec<f64>,
    /// Commits whose checkpoint arrived before the commit returned.
    before_return: usize,
    /// Commits that touched no row.
    no_row: usize,
}

impl Measured {
    /// The times of `commits`.
    fn of(commits: &[Commit]) -> Self {
        let mut latencies = Vec::new();
        let mut round_trips = Vec::new();
        let mut before_return = 0usize;
        let mut no_row = 0usize;
        for c in commits {
            if let (Some(sent), Some(returned)) = (c.sent, c.returned) {
                round_trips.push((returned - sent).as_secs_f64() * 1e3);
                if c.rows == 0 {
                    no_row += 1;
                }
                if let Some(seen) = c.seen {
                    if seen < returned {
                        before_return += 1;
                    }
                    latencies.push(seen.saturating_duration_since(returned).as_secs_f64() * 1e3);
                }
            }
        }
        Self {
            latencies,
            round_trips,
            before_return,
            no_row,
        }
    }
}

/// One planned commit.
#[derive(Debug, Clone, Copy, Default)]
struct Commit {
    sent: Option<Instant>,
    returned: Option<Instant>,
    rows: u64,
    /// The `checkpoint_complete` that first carried it (or a later commit of its user).
    seen: Option<Instant>,
}

/// What every commit worker shares.
struct Plan {
    /// The user (stream index) of each commit.
    users: Vec<usize>,
    rate: f64,
    sql: String,
    /// Each stream's user id.
    names: Vec<String>,
}

/// A commit that returned.
struct Returned {
    seq: usize,
    sent: Instant,
    at: Instant,
    rows: u64,
}

/// Issues every planned commit over `connections` connections to `primary`, on a thread
/// and runtime of its own: a commit's return is stamped when it arrives, not when the
/// streams' readers leave a thread free. Returns the errors.
fn issue_commits(
    primary: &str,
    connections: usize,
    plan: &Arc<Plan>,
    tx: &UnboundedSender<Returned>,
) -> Vec<String> {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return vec![format!("the commits' runtime: {e}")],
    };
    runtime.block_on(async {
        let mut errors = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..connections {
            match tokio_postgres::connect(primary, tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    clients.push(client);
                }
                Err(e) => errors.push(format!("connect: {e}")),
            }
        }
        let started = Instant::now();
        let step = clients.len();
        let mut workers = tokio::task::JoinSet::new();
        for (k, client) in clients.into_iter().enumerate() {
            let (plan, tx) = (plan.clone(), tx.clone());
            workers.spawn(commit_worker(client, plan, started, k, step, tx));
        }
        while let Some(done) = workers.join_next().await {
            match done {
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(e.to_string()),
                Ok(Ok(())) => {}
            }
        }
        errors
    })
}

/// Issues commits `k, k + step, ...`, each at its planned time (`seq / rate` after
/// `started`), or at once when behind.
async fn commit_worker(
    client: tokio_postgres::Client,
    plan: Arc<Plan>,
    started: Instant,
    k: usize,
    step: usize,
    tx: UnboundedSender<Returned>,
) -> Result<(), String> {
    let statement = client
        .prepare(&plan.sql)
        .await
        .map_err(|e| format!("prepare: {e}"))?;
    for seq in (k..plan.users.len()).step_by(step) {
        let due = started + Duration::from_secs_f64(seq as f64 / plan.rate);
        tokio::time::sleep_until(due.into()).await;
        let marker = format!("{MARKER}{seq}");
        let user = &plan.names[plan.users[seq]];
        let sent = Instant::now();
        let rows = client
            .execute(&statement, &[&marker, user])
            .await
            .map_err(|e| format!("commit {seq}: {e}"))?;
        let _ = tx.send(Returned {
            seq,
            sent,
            at: Instant::now(),
            rows,
        });
    }
    Ok(())
}

/// The user of each of `total` commits among `count`: every user once in a random order
/// (a new order each round). A user's commits are then `count / rate` apart, so two of
/// them are never in flight at once and each marker is the row's value until the next.
fn schedule(seed: u64, total: usize, count: usize) -> Vec<usize> {
    let count = count.max(1);
    let mut state = seed;
    let mut users = Vec::with_capacity(total + count);
    while users.len() < total {
        let mut round: Vec<usize> = (0..count).collect();
        for i in (1..count).rev() {
            let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
            round.swap(i, j);
        }
        users.extend(round);
    }
    users.truncate(total);
    users
}

/// The next number of the splitmix64 sequence at `state`.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_holds_every_user_once_in_an_order_fixed_by_the_seed() {
        let users = schedule(7, 250, 100);
        assert_eq!(users, schedule(7, 250, 100));
        assert_ne!(users, schedule(8, 250, 100));
        for round in users.chunks(100).take(2) {
            let mut sorted = round.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        }
        assert_ne!(users[..100], users[100..200]);
        assert_ne!(users[..100], (0..100).collect::<Vec<_>>()[..]);
    }
}
