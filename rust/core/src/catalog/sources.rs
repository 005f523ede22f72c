//! Which files a source names: files, directories (walked recursively) and globs, resolved to a
//! sorted, de-duplicated list of absolute paths, and the common root they are known relative to.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

fn has_glob_chars(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Expand files, directories (every `*.parquet` below, recursively) and globs into a sorted,
/// de-duplicated list of absolute file paths. Anything that names nothing is an error naming it.
pub fn resolve_sources(sources: &[String]) -> Result<Vec<PathBuf>> {
    if sources.is_empty() {
        return Err(Error::Config(
            "no source given: pass a file, directory or glob".into(),
        ));
    }
    let mut out = BTreeSet::new();
    for src in sources {
        let before = out.len();
        if has_glob_chars(src) {
            let entries =
                glob::glob(src).map_err(|e| Error::Config(format!("bad glob {src:?}: {e}")))?;
            for entry in entries {
                let p =
                    entry.map_err(|e| Error::io(e.path(), std::io::Error::other(e.to_string())))?;
                if p.is_dir() {
                    walk_dir(&p, &mut out)?;
                } else {
                    out.insert(absolute(&p)?);
                }
            }
            if out.len() == before {
                return Err(Error::NotFound {
                    path: src.clone(),
                    what: "no files match the glob".into(),
                });
            }
        } else {
            let p = Path::new(src);
            let meta = std::fs::metadata(p).map_err(|e| Error::io(p, e))?;
            if meta.is_dir() {
                walk_dir(p, &mut out)?;
                if out.len() == before {
                    return Err(Error::NotFound {
                        path: src.clone(),
                        what: "no *.parquet files under the directory".into(),
                    });
                }
            } else {
                out.insert(absolute(p)?);
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// Absolute and lexically normalized (`a/./b/../c` -> `a/c`), so two spellings of one file are
/// one shard. Not `canonicalize`: following symlinks would rename shards in the fingerprint.
fn absolute(p: &Path) -> Result<PathBuf> {
    use std::path::Component;
    let abs = std::path::absolute(p).map_err(|e| Error::io(p, e))?;
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

fn walk_dir(dir: &Path, out: &mut BTreeSet<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        let ft = entry.file_type().map_err(|e| Error::io(&path, e))?;
        if ft.is_dir() || (ft.is_symlink() && path.is_dir()) {
            walk_dir(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "parquet") {
            out.insert(absolute(&path)?);
        }
    }
    Ok(())
}

/// The deepest directory containing every shard.
pub(super) fn common_root(paths: &[PathBuf]) -> PathBuf {
    let mut root: PathBuf = match paths.first().and_then(|p| p.parent()) {
        Some(p) => p.to_path_buf(),
        None => return PathBuf::new(),
    };
    for p in &paths[1..] {
        while !p.starts_with(&root) {
            if !root.pop() {
                return PathBuf::new();
            }
        }
    }
    root
}
