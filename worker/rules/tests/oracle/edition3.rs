//! The edition-3 expression forms the official compiler takes beside the older editions'
//! (`BETWEEN`, `CASE`), and those it reads otherwise (`!=` as `NOT (=)`) or refuses (a
//! minus before anything but a number).

use super::wildcard::stream;
use super::Case;

/// Every edition-3 expression case.
pub fn all() -> Vec<Case> {
    vec![
        stream("edition3/between", "SELECT id FROM todos_a WHERE id BETWEEN ''a1'' AND ''a3''"),
        stream("edition3/not-between", "SELECT id, list_id NOT BETWEEN ''l0'' AND ''l1'' AS outside FROM todos_a"),
        stream("edition3/between-null", "SELECT id, id BETWEEN nope AND ''z'' AS b, nope BETWEEN 1 AND 2 AS c, id BETWEEN ''a'' AND nope AS d FROM todos_a"),
        stream("edition3/case", "SELECT id, CASE WHEN owner_id = ''u1'' THEN ''mine'' ELSE ''other'' END AS who FROM todos_a"),
        stream("edition3/case-operand", "SELECT id, CASE owner_id WHEN ''u1'' THEN 1 WHEN ''u2'' THEN 2 END AS n FROM todos_a"),
        stream("edition3/case-in-where", "SELECT id FROM todos_a WHERE CASE WHEN list_id = ''l1'' THEN owner_id = auth.user_id() ELSE 0 END"),
        stream("edition3/case-null-operand", "SELECT id, CASE nope WHEN NULL THEN ''null'' ELSE ''else'' END AS n FROM todos_a"),
        stream("edition3/not-equal-null", "SELECT id, (nope != nope) AS x, (nope <> 1) AS y, NOT (nope = 1) AS z FROM todos_a"),
        stream("edition3/not-equal-filter", "SELECT id FROM todos_a WHERE list_id != ''l2'' AND owner_id = auth.user_id()"),
        stream("edition3/unary-minus-number", "SELECT id, -1 AS m, -2.5 AS r FROM todos_a"),
        stream("edition3/unary-minus-expression", "SELECT id, -(1) AS m FROM todos_a"),
        stream("edition3/unary-minus-column", "SELECT id, -nope AS m FROM todos_a"),
    ]
}
