//! The environment in either of libmdbx's two ways of writing pages, and its transactions.
//!
//! Through file writes ([`NoWriteMap`]) a write transaction keeps its dirty pages in
//! buffers of its own (spilling them to the file past `TXN_DIRTY_PAGES`) and writes them at
//! commit; through a writable map ([`WriteMap`]) it changes the mapped file's pages in
//! place. The mode is fixed when libmdbx opens the environment, so the store opens it
//! again to change it (`Store::write_through_map`). [`Txn`] is a transaction of either,
//! with the calls the store makes on it.

use std::path::Path;

use libmdbx::{
    Cursor, Database, DatabaseOptions, Decodable, Info, NoWriteMap, Stat, Table, Transaction,
    TransactionKind, WriteFlags, WriteMap, RO, RW,
};

/// An open environment.
pub(crate) enum Env {
    /// Pages written with file writes (the snapshot: see `Store::write_through_map`).
    Files(Database<NoWriteMap>),
    /// Pages written through the map.
    Map(Database<WriteMap>),
}

/// A transaction of an [`Env`], owned: committed or aborted (dropped).
pub(crate) enum OwnedTxn<'db, K: TransactionKind> {
    Files(Transaction<'db, K, NoWriteMap>),
    Map(Transaction<'db, K, WriteMap>),
}

/// A transaction of either kind of environment, borrowed.
pub(crate) enum Txn<'t, 'db, K: TransactionKind> {
    Files(&'t Transaction<'db, K, NoWriteMap>),
    Map(&'t Transaction<'db, K, WriteMap>),
}

impl<K: TransactionKind> Clone for Txn<'_, '_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K: TransactionKind> Copy for Txn<'_, '_, K> {}

/// Runs `$call` on the transaction inside `$txn`, bound to `$t`, whatever its kind.
macro_rules! on_txn {
    ($txn:expr, $t:ident => $call:expr) => {
        match $txn {
            Txn::Files($t) => $call,
            Txn::Map($t) => $call,
        }
    };
}

/// Runs `$call` on the database inside `$env`, bound to `$db`, whatever its kind.
macro_rules! on_env {
    ($env:expr, $db:ident => $call:expr) => {
        match $env {
            Env::Files($db) => $call,
            Env::Map($db) => $call,
        }
    };
}

impl Env {
    /// Opens the environment in `dir` with `options`, writing through the map when `map`.
    pub fn open(dir: &Path, options: DatabaseOptions, map: bool) -> libmdbx::Result<Self> {
        Ok(if map {
            Self::Map(Database::open_with_options(dir, options)?)
        } else {
            Self::Files(Database::open_with_options(dir, options)?)
        })
    }

    /// True when it writes through the map.
    pub fn is_map(&self) -> bool {
        matches!(self, Self::Map(_))
    }

    pub fn begin_ro_txn(&self) -> libmdbx::Result<OwnedTxn<'_, RO>> {
        on_env!(self, db => db.begin_ro_txn().map(OwnedTxn::from))
    }

    pub fn begin_rw_txn(&self) -> libmdbx::Result<OwnedTxn<'_, RW>> {
        on_env!(self, db => db.begin_rw_txn().map(OwnedTxn::from))
    }

    pub fn sync(&self, force: bool) -> libmdbx::Result<bool> {
        on_env!(self, db => db.sync(force))
    }

    pub fn stat(&self) -> libmdbx::Result<Stat> {
        on_env!(self, db => db.stat())
    }

    pub fn info(&self) -> libmdbx::Result<Info> {
        on_env!(self, db => db.info())
    }
}

impl<'db, K: TransactionKind> OwnedTxn<'db, K> {
    /// The transaction, borrowed.
    pub fn borrow(&self) -> Txn<'_, 'db, K> {
        match self {
            Self::Files(t) => Txn::Files(t),
            Self::Map(t) => Txn::Map(t),
        }
    }

    pub fn commit(self) -> libmdbx::Result<bool> {
        match self {
            Self::Files(t) => t.commit(),
            Self::Map(t) => t.commit(),
        }
    }
}

impl<'db, K: TransactionKind> From<Transaction<'db, K, NoWriteMap>> for OwnedTxn<'db, K> {
    fn from(txn: Transaction<'db, K, NoWriteMap>) -> Self {
        Self::Files(txn)
    }
}

impl<'db, K: TransactionKind> From<Transaction<'db, K, WriteMap>> for OwnedTxn<'db, K> {
    fn from(txn: Transaction<'db, K, WriteMap>) -> Self {
        Self::Map(txn)
    }
}

impl<'t, 'db, K: TransactionKind> From<&'t Transaction<'db, K, NoWriteMap>> for Txn<'t, 'db, K> {
    fn from(txn: &'t Transaction<'db, K, NoWriteMap>) -> Self {
        Self::Files(txn)
    }
}

impl<'t, 'db, K: TransactionKind> From<&'t Transaction<'db, K, WriteMap>> for Txn<'t, 'db, K> {
    fn from(txn: &'t Transaction<'db, K, WriteMap>) -> Self {
        Self::Map(txn)
    }
}

impl<'t, K: TransactionKind> Txn<'t, '_, K> {
    pub fn get<Value: Decodable<'t>>(
        self,
        table: &Table<'t>,
        key: impl AsRef<[u8]>,
    ) -> libmdbx::Result<Option<Value>> {
        on_txn!(self, t => t.get(table, key))
    }

    pub fn open_table(self, name: Option<&str>) -> libmdbx::Result<Table<'t>> {
        on_txn!(self, t => t.open_table(name))
    }

    pub fn table_stat(self, table: &Table<'t>) -> libmdbx::Result<Stat> {
        on_txn!(self, t => t.table_stat(table))
    }

    pub fn cursor(self, table: &Table<'t>) -> libmdbx::Result<Cursor<'t, K>> {
        on_txn!(self, t => t.cursor(table))
    }

    /// The raw transaction handle (see [`Transaction::txn`]).
    pub fn txn(self) -> libmdbx::TxnPtr {
        on_txn!(self, t => t.txn())
    }
}

impl<'t> Txn<'t, '_, RW> {
    pub fn put(
        self,
        table: &Table<'t>,
        key: impl AsRef<[u8]>,
        data: impl AsRef<[u8]>,
        flags: WriteFlags,
    ) -> libmdbx::Result<()> {
        on_txn!(self, t => t.put(table, key, data, flags))
    }

    pub fn del(
        self,
        table: &Table<'t>,
        key: impl AsRef<[u8]>,
        data: Option<&[u8]>,
    ) -> libmdbx::Result<bool> {
        on_txn!(self, t => t.del(table, key, data))
    }

    pub fn clear_table(self, table: &Table<'t>) -> libmdbx::Result<()> {
        on_txn!(self, t => t.clear_table(table))
    }
}
