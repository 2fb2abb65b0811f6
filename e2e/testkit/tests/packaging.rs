//! The image and compose packaging (`Dockerfile.pg16`, `docker-compose.yml`, `docker/`):
//! no image registry is reachable here, so the image is not built; instead the compose
//! file is validated by Debian's `docker-compose config`, the configuration it mounts is
//! loaded, and the scripts the image runs (its init script and its health check) run
//! against a live sync replica. The image's build step is `scripts/install_extension.sh`,
//! which `scripts/test.sh` installs with.
use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::{free_port, Cluster, ClusterKind, PgInstall, TestDir};

/// A base64url HS256 secret for the compose file's `PS_JWT_SECRET_B64URL`.
const SECRET: &str = "cHNtLWNvbXBvc2UtdGVzdC1zZWNyZXQtMDEyMzQ1Njc4OWFi";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_compose_file_validates_and_its_configuration_loads() {
    let out = Command::new("docker-compose")
        .args(["-f", "docker-compose.yml", "config", "-q"])
        .current_dir(repo())
        .env("PS_JWT_SECRET_B64URL", SECRET)
        .output()
        .unwrap_or_else(|e| {
            panic!("docker-compose cannot run ({e}): scripts/setup.sh installs Debian's package")
        });
    assert!(
        out.status.success(),
        "docker-compose config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = |name: &str| match name {
        "PS_DATA_SOURCE_URI" => {
            Some("postgresql://powersync_replication:change-me@primary:5432/postgres".to_owned())
        }
        "PS_JWT_SECRET_B64URL" => Some(SECRET.to_owned()),
        _ => None,
    };
    let path = repo().join("docker/powersync.yaml");
    let config = config::ServiceConfig::parse(&path, &read("docker/powersync.yaml"), &env)
        .unwrap_or_else(|e| panic!("docker/powersync.yaml: {e}"));
    assert_eq!(config.ignored, Vec::<String>::new());
    assert_eq!(config.port, 8080);
    // Every file the compose file mounts exists.
    for mounted in read("docker-compose.yml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- ./"))
    {
        let file = mounted.split(':').next().unwrap();
        assert!(
            repo().join(file).exists(),
            "docker-compose.yml mounts {file}"
        );
    }
}

/// Runs a script of `docker/` with psql of `install` on the PATH, pointed at `cluster`.
fn run_script(install: &PgInstall, cluster: &Cluster, script: &str) -> (bool, String) {
    let path = format!(
        "{}:{}",
        install.bin().display(),
        std::env::var("PATH").unwrap()
    );
    let out = Command::new(repo().join(script))
        .env("PATH", path)
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", cluster.port().to_string())
        .env("POSTGRES_USER", "postgres")
        .env("POSTGRES_DB", "postgres")
        .output()
        .unwrap_or_else(|e| panic!("{script} runs: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_images_init_script_and_health_check_work_on_a_live_sync_replica() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql_file(&repo().join("sql/primary-setup.sql"), &[]);
    primary.sql_file(&repo().join("docker/primary-example.sql"), &[]);
    primary.sql("INSERT INTO todos VALUES ('t1', 'u1', 'from the example', false)");
    // The compose file's configuration, on a free port, with the environment the compose
    // file gives the server.
    let port = free_port();
    let config = read("docker/powersync.yaml").replace("port: 8080", &format!("port: {port}"));
    let replica_install = install
        .with_env(
            "PS_DATA_SOURCE_URI",
            &primary
                .uri("powersync_replication")
                .replace("powersync_replication@", "powersync_replication:change-me@"),
        )
        .with_env("PS_JWT_SECRET_B64URL", SECRET);
    let replica = Cluster::start_sync_replica(&replica_install, &dir, &config, &[]);
    replica.wait_worker_phase("streaming");
    let (healthy, text) = run_script(&install, &replica, "docker/healthcheck.sh");
    assert!(healthy, "{text}");
    assert!(text.contains("healthy: streaming"), "{text}");

    // Without the extension the check fails; the init script creates it.
    replica.sql("DROP EXTENSION powersync_mdbx");
    let (healthy, text) = run_script(&install, &replica, "docker/healthcheck.sh");
    assert!(!healthy, "{text}");
    assert!(text.contains("unhealthy"), "{text}");
    let (created, text) = run_script(&install, &replica, "docker/initdb/10-powersync-mdbx.sh");
    assert!(created, "{text}");
    assert_eq!(
        replica.sql("SELECT count(*) FROM pg_extension WHERE extname = 'powersync_mdbx'"),
        "1"
    );
    let (healthy, text) = run_script(&install, &replica, "docker/healthcheck.sh");
    assert!(healthy, "{text}");
}

#[test]
fn the_dockerfile_runs_only_what_the_suite_runs() {
    let dockerfile = read("Dockerfile.pg16");
    let test_command = read("scripts/test.sh");
    for line in dockerfile.lines().map(str::trim) {
        if let Some(script) = line
            .strip_prefix("RUN scripts/")
            .and_then(|rest| rest.split_whitespace().next())
        {
            assert!(
                test_command.contains(&format!("scripts/{script}")),
                "the image runs scripts/{script}, which scripts/test.sh does not"
            );
        }
        if let Some(copied) = line
            .strip_prefix("COPY ")
            .filter(|rest| !rest.starts_with("--from"))
        {
            let source = copied.split_whitespace().next().unwrap();
            assert!(
                repo().join(source).exists(),
                "the image copies {source}, which does not exist"
            );
            if source.starts_with("docker/") {
                assert!(
                    read("e2e/testkit/tests/packaging.rs").contains(source),
                    "the image copies {source}, which no test runs"
                );
            }
        }
    }
    assert!(dockerfile.contains("HEALTHCHECK"));
    assert!(repo().join(".dockerignore").exists());
}
