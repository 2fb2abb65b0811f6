//! Who may take a copy of the store (`GET /peer/store`), and how many at once: the fleet's
//! secret (as its SHA-256), whether the sync port serves copies to loopback connections
//! at all (`powersync_mdbx.peer_loopback`, off by default: behind a local TLS proxy every
//! internet client is loopback), the failed attempts of each address (throttled and
//! logged), and the copy slots, taken only once a request has proved the secret.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Failed secrets one address may present per [`FAILURE_WINDOW`]; past them its requests
/// are refused unchecked until the window ends.
pub const MAX_FAILURES: u32 = 5;
/// See [`MAX_FAILURES`].
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses whose failures are remembered; past it, the new ones share one count.
const REMEMBERED_ADDRESSES: usize = 1024;
/// Copies of the store served at once (each holds a read transaction of the store).
pub const MAX_COPIES: usize = 8;

/// The gate of the peer endpoint; one per engine, shared by the sync port and the peer
/// listener.
pub struct PeerGate {
    secret: [u8; 32],
    loopback: bool,
    failures: Mutex<HashMap<Option<IpAddr>, Failures>>,
    copies: Arc<Semaphore>,
}

/// The failed attempts of one address in its current window.
#[derive(Debug, Clone, Copy)]
struct Failures {
    since: Instant,
    count: u32,
}

/// Why a request's secret was not checked or not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretRefusal {
    /// Missing or wrong.
    Wrong,
    /// Too many failures from this address lately: not checked; retry after this long.
    Throttled(Duration),
}

impl PeerGate {
    /// A gate for the secret `secret`; `loopback`: the sync port serves copies to
    /// connections from this host.
    pub fn new(secret: &[u8], loopback: bool) -> Self {
        Self {
            secret: Sha256::digest(secret).into(),
            loopback,
            failures: Mutex::new(HashMap::new()),
            copies: Arc::new(Semaphore::new(MAX_COPIES)),
        }
    }

    /// The sync port serves copies to loopback connections.
    pub fn serves_loopback(&self) -> bool {
        self.loopback
    }

    /// Checks `authorization` (`Bearer <secret>`) from `address`. The digests are compared
    /// in constant time, so neither the secret's bytes nor its length show in the answer's
    /// timing; an address past [`MAX_FAILURES`] is refused without a check.
    pub fn check_secret(
        &self,
        address: IpAddr,
        authorization: Option<&[u8]>,
    ) -> Result<(), SecretRefusal> {
        let now = Instant::now();
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let key = Some(address);
        if let Some(wait) = throttled(failures.get(&key).or(failures.get(&None)), now) {
            return Err(SecretRefusal::Throttled(wait));
        }
        let given = authorization.and_then(|v| v.strip_prefix(b"Bearer ".as_slice()));
        let right = given
            .is_some_and(|given| bool::from(Sha256::digest(given).as_slice().ct_eq(&self.secret)));
        if right {
            return Ok(());
        }
        if !failures.contains_key(&key) && failures.len() >= REMEMBERED_ADDRESSES {
            failures.retain(|_, f| now.duration_since(f.since) < FAILURE_WINDOW);
        }
        let key = if failures.contains_key(&key) || failures.len() < REMEMBERED_ADDRESSES {
            key
        } else {
            None
        };
        let entry = failures.entry(key).or_insert(Failures {
            since: now,
            count: 0,
        });
        if now.duration_since(entry.since) >= FAILURE_WINDOW {
            *entry = Failures {
                since: now,
                count: 0,
            };
        }
        entry.count += 1;
        if entry.count >= MAX_FAILURES {
            tracing::warn!(
                %address,
                failures = entry.count,
                "a peer store copy was asked for with a wrong secret too often; this address \
                 is refused for {FAILURE_WINDOW:?}"
            );
        } else {
            tracing::warn!(%address, "a peer store copy was asked for with a wrong or missing secret");
        }
        Err(SecretRefusal::Wrong)
    }

    /// A copy slot, if one is free; held for the copy's life.
    pub fn copy_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.copies.clone().try_acquire_owned().ok()
    }
}

/// How long an address with `failures` is still refused, if it is.
fn throttled(failures: Option<&Failures>, now: Instant) -> Option<Duration> {
    let failures = failures?;
    let age = now.duration_since(failures.since);
    (failures.count >= MAX_FAILURES && age < FAILURE_WINDOW).then(|| FAILURE_WINDOW - age)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a-peer-secret-of-enough-bytes";
    const GOOD: Option<&[u8]> = Some(b"Bearer a-peer-secret-of-enough-bytes");

    #[test]
    fn an_address_that_fails_too_often_is_refused_unchecked_and_others_are_not() {
        let gate = PeerGate::new(SECRET, false);
        let guesser: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.7".parse().unwrap();
        assert_eq!(gate.check_secret(guesser, GOOD), Ok(()));
        for _ in 0..MAX_FAILURES {
            assert_eq!(
                gate.check_secret(guesser, Some(b"Bearer guess")),
                Err(SecretRefusal::Wrong)
            );
        }
        // Even the right secret is not checked while the address is throttled.
        assert!(matches!(
            gate.check_secret(guesser, GOOD),
            Err(SecretRefusal::Throttled(wait)) if wait <= FAILURE_WINDOW
        ));
        assert_eq!(gate.check_secret(other, GOOD), Ok(()));
        assert_eq!(
            gate.check_secret(other, None),
            Err(SecretRefusal::Wrong),
            "no header is a failure too"
        );
    }

    #[test]
    fn failures_of_more_addresses_than_remembered_share_one_count() {
        let gate = PeerGate::new(SECRET, false);
        for i in 0..REMEMBERED_ADDRESSES as u32 {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            assert_eq!(gate.check_secret(address, None), Err(SecretRefusal::Wrong));
        }
        let beyond = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i));
        for i in 0..MAX_FAILURES {
            assert_eq!(
                gate.check_secret(beyond(i), None),
                Err(SecretRefusal::Wrong)
            );
        }
        assert!(matches!(
            gate.check_secret(beyond(99), GOOD),
            Err(SecretRefusal::Throttled(_))
        ));
        assert_eq!(
            gate.failures.lock().unwrap().len(),
            REMEMBERED_ADDRESSES + 1,
            "memory stays bounded"
        );
    }

    #[test]
    fn copies_take_a_slot_each_up_to_the_limit() {
        let gate = PeerGate::new(SECRET, true);
        let held: Vec<_> = (0..MAX_COPIES).map(|_| gate.copy_slot().unwrap()).collect();
        assert!(gate.copy_slot().is_none());
        drop(held);
        assert!(gate.copy_slot().is_some());
    }
}
