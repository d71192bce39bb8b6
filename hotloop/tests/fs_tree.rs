//! The `hotloop::fs` calls that run on the blocking pool on both drivers:
//! `read_dir` (in batches, more entries than one batch), `copy`,
//! `canonicalize`, `remove_dir_all`, links, permissions, `try_exists`,
//! and their errors, which name the operation and the path.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use hotloop::fs;

/// A fresh directory under the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("hotloop-fstree-{}-{n}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        TempDir(p)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Asserts that `e` has `kind` and a message that starts with `op path: `.
fn assert_names_path(e: &io::Error, kind: io::ErrorKind, op: &str, path: &Path) {
    assert_eq!(e.kind(), kind, "{e}");
    let prefix = format!("{op} {}: ", path.display());
    assert!(e.to_string().starts_with(&prefix), "{e:?} does not start with {prefix:?}");
}

#[hotloop::test(driver = "all")]
async fn read_dir_lists_every_entry_over_several_batches() {
    let dir = TempDir::new("read_dir");
    let files = fs::READ_DIR_BATCH * 2 + 5;
    for i in 0..files {
        std::fs::write(dir.join(&format!("f{i}")), [i as u8]).unwrap();
    }
    std::fs::create_dir(dir.join("sub")).unwrap();
    let mut entries = fs::read_dir(&dir.0).await.unwrap();
    let mut names = BTreeSet::new();
    let mut dirs = 0;
    while let Some(e) = entries.next_entry().await.unwrap() {
        assert_eq!(e.path(), dir.0.join(e.file_name()));
        if e.file_type().await.unwrap().is_dir() {
            dirs += 1;
        } else {
            assert_eq!(e.metadata().await.unwrap().len(), 1);
        }
        assert!(e.ino() > 0);
        assert!(names.insert(e.file_name().into_string().unwrap()), "an entry came twice");
    }
    assert_eq!(names.len(), files + 1);
    assert_eq!(dirs, 1);
    assert!(entries.next_entry().await.unwrap().is_none(), "the end stays the end");
    let missing = dir.join("missing");
    let e = fs::read_dir(&missing).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "opendir", &missing);
}

#[hotloop::test(driver = "all")]
async fn copy_canonicalize_and_links() {
    let dir = TempDir::new("copy");
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::write(&a, b"contents").unwrap();
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::copy(&a, &b).await.unwrap(), 8);
    assert_eq!(std::fs::read(&b).unwrap(), b"contents");
    assert_eq!(std::fs::metadata(&b).unwrap().permissions().mode() & 0o777, 0o640);

    let link = dir.join("link");
    fs::symlink(&a, &link).await.unwrap();
    assert_eq!(fs::read_link(&link).await.unwrap(), a);
    std::fs::create_dir(dir.join("sub")).unwrap();
    let canonical = fs::canonicalize(dir.join("./sub/../link")).await.unwrap();
    assert_eq!(canonical, std::fs::canonicalize(&a).unwrap());
    let hard = dir.join("hard");
    fs::hard_link(&a, &hard).await.unwrap();
    assert_eq!(std::fs::metadata(&a).unwrap().nlink(), 2);

    fs::set_permissions(&b, std::fs::Permissions::from_mode(0o600)).await.unwrap();
    assert_eq!(fs::metadata(&b).await.unwrap().mode() & 0o777, 0o600);
    assert!(fs::try_exists(&b).await.unwrap());
    assert!(!fs::try_exists(dir.join("nothing")).await.unwrap());

    let missing = dir.join("missing");
    let e = fs::copy(&missing, &b).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "copy", &missing);
    let e = fs::canonicalize(&missing).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "canonicalize", &missing);
}

#[hotloop::test(driver = "all")]
async fn remove_dir_all_removes_a_tree_without_following_links() {
    let dir = TempDir::new("remove");
    let outside = dir.join("outside");
    std::fs::write(&outside, b"keep").unwrap();
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
    std::fs::write(tree.join("a/b/c/f"), b"x").unwrap();
    std::fs::write(tree.join("a/g"), b"y").unwrap();
    std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
    fs::remove_dir_all(&tree).await.unwrap();
    assert!(!tree.exists());
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep", "a link inside was followed");
    let e = fs::remove_dir_all(&tree).await.unwrap_err();
    assert_names_path(&e, io::ErrorKind::NotFound, "remove_dir_all", &tree);
}
