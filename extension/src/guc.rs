//! The extension's settings (GUCs). Read only on the worker's main thread.

use std::ffi::CString;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// `powersync_mdbx.config_file`: the PowerSync service YAML file.
pub static CONFIG_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.storage_dir`: where the MDBX store lives.
pub static STORAGE_DIR: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.slot_name`: the replication slot this sync replica owns on the primary.
pub static SLOT_NAME: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"powersync_mdbx"));
/// `powersync_mdbx.listen_addresses`: hosts the HTTP server binds.
pub static LISTEN_ADDRESSES: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"127.0.0.1"));

/// `powersync_mdbx.peer_secret`: refused when set (see [`define`]); defined so that a value
/// left in postgresql.conf stays hidden from non-superusers instead of becoming a
/// placeholder anyone can `SHOW`.
pub static PEER_SECRET: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.peer_secret_file`: the file holding the secret replicas of one fleet share.
pub static PEER_SECRET_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.peer_loopback`: the sync port serves store copies to peers on this host.
pub static PEER_LOOPBACK: GucSetting<bool> = GucSetting::<bool>::new(false);
/// `powersync_mdbx.in_rotation`: off takes the replica out of rotation.
pub static IN_ROTATION: GucSetting<bool> = GucSetting::<bool>::new(true);
/// `powersync_mdbx.seed_from`: the peer an empty store is copied from.
pub static SEED_FROM: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.peer_listen`.
pub static PEER_LISTEN: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.peer_tls_cert_file`.
pub static PEER_TLS_CERT_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.peer_tls_key_file`.
pub static PEER_TLS_KEY_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
/// `powersync_mdbx.peer_tls_ca_file`.
pub static PEER_TLS_CA_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Registers the GUCs. Called from `_PG_init` in every process that loads the library,
/// so `SHOW` works everywhere. `storage_dir` can only be defined while the postmaster
/// preloads the library (PostgreSQL refuses postmaster-level settings later).
pub fn define(preloading: bool) {
    GucRegistry::define_string_guc(
        c"powersync_mdbx.config_file",
        c"Path of the PowerSync service configuration file (YAML).",
        c"The worker reads replication.connections, sync_config, client_auth and port from \
          it. Reloadable: SELECT pg_reload_conf() applies a changed file.",
        &CONFIG_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.listen_addresses",
        c"Comma-separated hosts the sync HTTP server listens on ('*' for all).",
        c"The port comes from the configuration file's `port` (default 8080).",
        &LISTEN_ADDRESSES,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.slot_name",
        c"Name of the logical replication slot this sync replica creates and owns on the primary.",
        c"Each sync replica needs its own slot. A slot of this name that the replica did not \
          create is refused.",
        &SLOT_NAME,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"powersync_mdbx.in_rotation",
        c"Off takes the sync replica out of rotation without a restart.",
        c"Off: the readiness probe fails (so load balancers stop sending clients), new sync \
          connections are refused with a retryable 503 and open sync streams end, while the \
          store and its ingest go on. On again with pg_reload_conf().",
        &IN_ROTATION,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    define_fleet();
    if !preloading {
        return;
    }
    GucRegistry::define_string_guc(
        c"powersync_mdbx.storage_dir",
        c"Directory of the MDBX bucket store.",
        c"Empty means a directory named after the data directory with the suffix \
          .powersync_mdbx, beside it. Created with mode 0700.",
        &STORAGE_DIR,
        GucContext::Postmaster,
        GucFlags::SUPERUSER_ONLY,
    );
}

/// The settings of a fleet of replicas: the peer secret, seeding and the peer listener.
fn define_fleet() {
    GucRegistry::define_string_guc(
        c"powersync_mdbx.peer_secret_file",
        c"File holding the secret the sync replicas of one fleet share (at least 16 bytes).",
        c"Mode 0600, owned by the server's user. With it the replica serves copies of its \
          store to peers that present the secret (GET /peer/store) and presents it to the \
          peer it seeds from. Unset: no peer endpoint.",
        &PEER_SECRET_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.peer_secret",
        c"Refused: use powersync_mdbx.peer_secret_file.",
        c"Members of pg_read_all_settings can read every setting, so the fleet's secret \
          lives in a file; the worker refuses to start while this is set.",
        &PEER_SECRET,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
    );
    GucRegistry::define_bool_guc(
        c"powersync_mdbx.peer_loopback",
        c"Serve store copies (GET /peer/store) on the sync port to peers on this host.",
        c"Off: the sync port serves no copies, since behind a local proxy every client \
          connects from this host; peers copy over TLS from powersync_mdbx.peer_listen. \
          On: loopback connections that present the secret and were not forwarded by a proxy.",
        &PEER_LOOPBACK,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.seed_from",
        c"Peer sync replica an empty store is copied from: https://<host>:<its peer_listen \
          port>, or http://127.0.0.1:<its sync port> on this host.",
        c"Instead of a snapshot, a replica with empty storage copies the peer's store and \
          streams its own slot from the copy's position, so both hold one history. Needs \
          powersync_mdbx.peer_secret_file (and, for https, powersync_mdbx.peer_tls_ca_file).",
        &SEED_FROM,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.peer_listen",
        c"Address and port (e.g. 0.0.0.0:8443) where peers copy this replica's store over TLS.",
        c"Serves GET /peer/store over TLS only, with powersync_mdbx.peer_tls_cert_file and \
          powersync_mdbx.peer_tls_key_file. Needs powersync_mdbx.peer_secret_file. Unset: \
          peers copy only on this host, on the sync port with powersync_mdbx.peer_loopback.",
        &PEER_LISTEN,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.peer_tls_cert_file",
        c"Certificate chain (PEM) the peer listener presents.",
        c"It must name the host peers put in their powersync_mdbx.seed_from.",
        &PEER_TLS_CERT_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.peer_tls_key_file",
        c"Private key (PEM) of powersync_mdbx.peer_tls_cert_file.",
        c"Readable by the PostgreSQL server's user only.",
        &PEER_TLS_KEY_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"powersync_mdbx.peer_tls_ca_file",
        c"CA certificates (PEM) a seeding replica trusts the https peer it copies from with.",
        c"Unset: the public web roots.",
        &PEER_TLS_CA_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
}

/// A string GUC's value, `None` when unset or empty.
pub fn get(setting: &GucSetting<Option<CString>>) -> Option<String> {
    setting
        .get()
        .map(|v| v.to_string_lossy().trim().to_owned())
        .filter(|v| !v.is_empty())
}
