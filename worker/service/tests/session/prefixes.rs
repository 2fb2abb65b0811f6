//! The property: random row changes across checkpoints (some after forks), clients
//! interrupted after every prefix of a download, tiny paging budgets.

use super::*;

fn random_change(db: &Db, rng: &mut Rng) -> Change {
    let _ = db;
    let id = rng.below(6).to_string();
    if rng.below(5) == 0 {
        let table = TABLES[rng.below(3) as usize];
        return (table, id, None);
    }
    match rng.below(3) {
        0 => {
            let owner = if rng.below(3) == 0 { "u2" } else { "u1" };
            (
                "lists",
                id.clone(),
                Some(cols(&[("id", &format!("L{id}")), ("owner_id", owner)])),
            )
        }
        1 => {
            let list = format!("L{}", rng.below(6));
            let title = format!("t{}", rng.below(100));
            (
                "todos",
                id.clone(),
                Some(cols(&[("id", &id), ("list_id", &list), ("title", &title)])),
            )
        }
        _ => {
            let flag = if rng.below(2) == 0 { "hot" } else { "cold" };
            let v = rng.below(1000).to_string();
            (
                "items",
                id.clone(),
                Some(cols(&[("id", &id), ("flag", flag), ("v", &v)])),
            )
        }
    }
}

fn run(seed: u64) {
    let mut db = Db::new();
    let mut rng = Rng(seed);
    let mut live_client = Client::default();
    let mut live = db.session(&[], tiny());
    for round in 0..14 {
        for _ in 0..=rng.below(2) {
            let changes = (0..=rng.below(4))
                .map(|_| random_change(&db, &mut rng))
                .collect();
            // Now and then a write of this replica alone: op ids jump past a fork.
            if rng.below(5) == 0 {
                db.commit_forking(changes);
            } else {
                db.commit(changes);
            }
        }
        let truth = db.truth();
        // The connected client sometimes takes only part of a download before the next
        // checkpoint arrives (superseding it).
        let limit = if rng.below(3) == 0 {
            rng.below(4) as usize
        } else {
            usize::MAX
        };
        step(&db, &mut live, &mut live_client, limit, Some(&truth));
        // A client that disconnects after every prefix of a fresh download and reconnects
        // with the positions it holds ends validated with exactly the current rows.
        let base = live_client.clone();
        let mut probe = base.clone();
        probe.reconnect();
        let mut s = db.session(&base.positions(), tiny());
        let full = step(&db, &mut s, &mut probe, usize::MAX, Some(&truth));
        assert_eq!(
            full.first().map(String::as_str),
            Some("checkpoint"),
            "first line"
        );
        assert_eq!(full.last().map(String::as_str), Some("checkpoint_complete"));
        let every = round == 13 || rng.below(2) == 0;
        let prefixes: Vec<usize> = if every {
            (0..full.len()).collect()
        } else {
            vec![rng.below(full.len() as u64) as usize]
        };
        for k in prefixes {
            let mut c = base.clone();
            c.reconnect();
            let mut s = db.session(&c.positions(), tiny());
            step(&db, &mut s, &mut c, k, Some(&truth));
            c.reconnect();
            let mut s = db.session(&c.positions(), tiny());
            let before = c.completions;
            step(&db, &mut s, &mut c, usize::MAX, Some(&truth));
            assert_eq!(
                c.completions,
                before + 1,
                "seed {seed} round {round} prefix {k}: completes"
            );
            // Nothing changed: no line at all.
            assert!(s.checkpoint(&db.store, None).unwrap().is_none());
        }
    }
    // Finally the live client catches up and is complete.
    let truth = db.truth();
    db.commit(vec![(
        "items",
        "99".into(),
        Some(cols(&[("id", "99"), ("flag", "hot"), ("v", "1")])),
    )]);
    let truth_after = db.truth();
    let _ = truth;
    let kinds = step(
        &db,
        &mut live,
        &mut live_client,
        usize::MAX,
        Some(&truth_after),
    );
    assert_eq!(kinds.first().map(String::as_str), Some("checkpoint_diff"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert!(live.checkpoint(&db.store, None).unwrap().is_none());
}

#[test]
fn clients_at_every_prefix_validate_with_the_current_rows() {
    for seed in [3, 11, 2024, 0xdead_beef, 77_777] {
        run(seed);
    }
}
