//! A small file system mounted for a test's life, to fill the disk under a store: a tmpfs,
//! or ext4 through a loop device (the file system a sync replica most likely runs on).
//! Mounting needs root (the CI runs as root), and ext4 a loop device and `mkfs.ext4`;
//! without them the test fails and says so. Unmounted (lazily) when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted small file system.
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    /// A tmpfs of `size` (`160m`) at `at`.
    pub fn tmpfs(at: &Path, size: &str) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        let options = format!("size={size},mode=0700");
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
            .arg(at));
        Self(at.to_owned())
    }

    /// An ext4 file system of `mib` MiB in the file `image`, mounted at `at` through a
    /// loop device (no blocks reserved for root: the test fills it as root).
    pub fn ext4(image: &Path, at: &Path, mib: u64) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        std::fs::File::create(image)
            .and_then(|f| f.set_len(mib << 20))
            .expect("disk image");
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(image)
            .arg(at));
        std::fs::set_permissions(at, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("chmod");
        Self(at.to_owned())
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Hands the mounted directory to the OS user `user` (the one the clusters run as).
    pub fn give_to(&self, user: &str) {
        run(Command::new("chown").arg(user).arg(&self.0));
    }

    /// Fills it with one file until it refuses more; returns the file (remove it to free
    /// the space).
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).expect("filler");
        let block = vec![0xA5u8; 64 << 10];
        while file.write_all(&block).is_ok() {}
        let _ = file.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Runs a command the disk needs, failing with what it printed.
fn run(command: &mut Command) {
    let out = command.output().unwrap_or_else(|e| {
        panic!("this test runs {command:?} (as root, the CI does) and could not: {e}")
    });
    assert!(
        out.status.success(),
        "this test mounts a small file system as the store's disk and needs root, loop \
         devices and mkfs.ext4 (the CI has them): {command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
