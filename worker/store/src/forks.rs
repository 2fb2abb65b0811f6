//! Where a store's op ids left the history it shares with its peers.
//!
//! Stores of one history (one seeded from the other) give the same op ids to the same
//! source transactions. A write decided by one replica alone (a table's re-copy merged, a
//! table gone after its grace period, a rebuild from a new slot, a rules deploy) would give
//! ids that its peers give to other ops. Before such a write's first op, the store *forks*:
//! its op ids jump by a random distance of at least [`MIN_JUMP`] and the fork is recorded
//! (meta key `forks`). A client position is then one of the store's own only when it lies
//! in a stretch of ids this store gave out; one in a gap, or far above the store's last op
//! id, came from a peer whose history went another way, and the client's copy of that
//! bucket is cleared and downloaded again rather than trusted (`docs/storage.md`,
//! "Forks of a history").

use super::StoreError;

/// Meta key of the forks: `(left_at, resumed_at)` pairs, u64 little endian each, oldest
/// first.
pub(super) const KEY_FORKS: &[u8] = b"forks";

/// The least distance op ids jump at a fork (4.3 billion); also the most a position from a
/// peer of the same history may lie above this store's last op id (a peer further along).
pub const MIN_JUMP: u64 = 1 << 32;

/// The random part of a jump: below this (1.1 trillion). Two replicas forking at the same
/// point pick overlapping stretches with a chance of about twice the ops written after
/// the fork over this (one in 5,000 for 100 million ops); op ids stay below 2^53, exact
/// in the JavaScript numbers some clients parse them into, for about 16,000 forks.
const JUMP_SPREAD: u64 = 1 << 40;

/// One fork: op ids above `left_at` and up to `resumed_at` were never given out here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fork {
    /// The last op id of the shared history.
    pub left_at: u64,
    /// The op id the store went on from (its next op is `resumed_at + 1`).
    pub resumed_at: u64,
}

/// How a client's position in a bucket relates to this store's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// An op id this store gave out (or 0): ops after it can be sent.
    Own,
    /// Above the store's last op id, within reach of a peer of the same history that is
    /// further along: the store may catch up to it.
    Ahead,
    /// From a history that went another way: the client's copy must be cleared.
    Foreign,
}

/// The forks of a store, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forks(Vec<Fork>);

impl Forks {
    /// Where `position` lies for a store whose last op id is `head`.
    pub fn place(&self, position: u64, head: u64) -> Placement {
        if position > head {
            return if position - head < MIN_JUMP {
                Placement::Ahead
            } else {
                Placement::Foreign
            };
        }
        if self
            .0
            .iter()
            .any(|f| position > f.left_at && position < f.resumed_at)
        {
            Placement::Foreign
        } else {
            Placement::Own
        }
    }

    /// How many op ids this store gave out above `from` up to `to`: their distance less
    /// the ids forks skipped between them.
    pub fn given_out(&self, from: u64, to: u64) -> u64 {
        let skipped: u64 = self
            .0
            .iter()
            .filter(|f| f.left_at >= from && f.resumed_at <= to)
            .map(|f| f.resumed_at - f.left_at)
            .sum();
        to.saturating_sub(from).saturating_sub(skipped)
    }

    /// The forks, oldest first.
    pub fn list(&self) -> &[Fork] {
        &self.0
    }

    /// A fork after op id `left_at`, with a random jump.
    pub(super) fn add(&mut self, left_at: u64, random: u64) -> Fork {
        let resumed_at = left_at
            .saturating_add(MIN_JUMP)
            .saturating_add(random % JUMP_SPREAD);
        let fork = Fork {
            left_at,
            resumed_at,
        };
        self.0.push(fork);
        fork
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        self.0
            .iter()
            .flat_map(|f| {
                let mut pair = [0u8; 16];
                pair[..8].copy_from_slice(&f.left_at.to_le_bytes());
                pair[8..].copy_from_slice(&f.resumed_at.to_le_bytes());
                pair
            })
            .collect()
    }

    pub(super) fn decode(bytes: &[u8], dir: &std::path::Path) -> Result<Self, StoreError> {
        if !bytes.len().is_multiple_of(16) {
            return Err(StoreError::corrupt(dir, "forks"));
        }
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        Ok(Self(
            bytes
                .chunks_exact(16)
                .map(|pair| Fork {
                    left_at: word(&pair[..8]),
                    resumed_at: word(&pair[8..]),
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_in_a_gap_or_far_ahead_are_foreign() {
        let mut forks = Forks::default();
        let fork = forks.add(100, 12345);
        assert_eq!(fork.resumed_at, 100 + MIN_JUMP + 12345);
        let head = fork.resumed_at + 50;
        assert_eq!(forks.place(0, head), Placement::Own);
        assert_eq!(forks.place(100, head), Placement::Own);
        assert_eq!(forks.place(101, head), Placement::Foreign);
        assert_eq!(forks.place(fork.resumed_at - 1, head), Placement::Foreign);
        assert_eq!(forks.place(fork.resumed_at, head), Placement::Own);
        assert_eq!(forks.place(head, head), Placement::Own);
        assert_eq!(forks.place(head + 10, head), Placement::Ahead);
        assert_eq!(forks.place(head + MIN_JUMP, head), Placement::Foreign);
        assert_eq!(forks.given_out(90, head), 10 + 50);
        assert_eq!(forks.given_out(fork.resumed_at, head), 50);
        let decoded = Forks::decode(&forks.encode(), std::path::Path::new("/x")).unwrap();
        assert_eq!(decoded, forks);
        assert!(Forks::decode(&[1, 2, 3], std::path::Path::new("/x")).is_err());
    }
}
