//! A transaction held open on a cluster by a `psql` session of its own, as a long-running
//! transaction of an application would be: it keeps its transaction id (and any locks)
//! until [`HeldTransaction::commit`], or until dropped (the session is killed, the
//! transaction rolls back).

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::cluster::Cluster;
use crate::wait::wait_for;

/// A transaction left open by [`Cluster::hold_transaction`].
pub struct HeldTransaction {
    session: Child,
    input: Option<ChildStdin>,
}

impl Cluster {
    /// Opens a transaction running `statements` and leaves it open (idle in
    /// transaction) until the value is committed or dropped. Returns once the primary
    /// shows it idle in its transaction.
    pub fn hold_transaction(&self, statements: &str) -> HeldTransaction {
        static SESSIONS: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "psm_held_{}_{}",
            std::process::id(),
            SESSIONS.fetch_add(1, Ordering::Relaxed)
        );
        let mut session = Command::new(self.install().program("psql"))
            .arg(self.uri("postgres"))
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
            .env("PGAPPNAME", &name)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("psql runs");
        let mut input = session.stdin.take().expect("psql's stdin");
        writeln!(input, "BEGIN;\n{statements};").expect("psql reads its input");
        input.flush().expect("psql reads its input");
        let held = HeldTransaction {
            session,
            input: Some(input),
        };
        let query = format!(
            "SELECT state FROM pg_stat_activity WHERE application_name = '{name}' \
             AND state = 'idle in transaction'"
        );
        wait_for(
            &format!("the transaction held open ({statements})"),
            || match self.sql(&query).as_str() {
                "idle in transaction" => Ok(()),
                _ => Err(()),
            },
        );
        held
    }
}

impl HeldTransaction {
    /// Commits the transaction and ends its session.
    pub fn commit(mut self) {
        let mut input = self.input.take().expect("the session is open");
        writeln!(input, "COMMIT;").expect("psql reads its input");
        drop(input);
        let status = self.session.wait().expect("psql ends");
        assert!(status.success(), "the held transaction's COMMIT: {status}");
    }
}

impl Drop for HeldTransaction {
    fn drop(&mut self) {
        if self.input.is_some() {
            let _ = self.session.kill();
            let _ = self.session.wait();
        }
    }
}
