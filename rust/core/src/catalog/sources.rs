//! Which files a source names: files, directories (walked recursively) and globs, resolved to a
//! sorted, de-duplicated list of absolute paths, and the common root they are known relative to.
//!
//! What a directory walk reads (as pyarrow.dataset and Spark do): every `*.parquet` file below,
//! except names starting with `.` or `_` — files and directories — which writers use for
//! temporary and bookkeeping files (Spark's `_temporary/` attempts and `_SUCCESS`, Hadoop's
//! `.part-….crc`, editors' and sync tools' hidden files). A glob skips them too unless its
//! pattern spells the `.` or `_` (as shells treat leading dots); a file named explicitly is
//! always read. Symbolic links are followed; a link to a directory that contains it (a loop)
//! is an error naming the link, as are `*.parquet` links that are broken or loop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};

fn has_glob_chars(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Names a walk or a glob wildcard skips: hidden and temporary files and directories.
fn is_hidden(name: &std::ffi::OsStr) -> bool {
    let b = name.as_encoded_bytes();
    b.first().is_some_and(|&c| c == b'.' || c == b'_')
}

/// File extensions a directory walk reads: Parquet and Arrow IPC (file and stream) shards.
/// Which format a file is, is decided by its magic bytes, not by this.
pub const SHARD_EXTENSIONS: [&str; 5] = ["parquet", "arrow", "feather", "arrows", "ipc"];

fn is_shard_name(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| SHARD_EXTENSIONS.iter().any(|x| e == *x))
}

/// An HF `datasets` `save_to_disk` directory (`state.json` listing `_data_files`): its data
/// files in the order `state.json` lists them (the order `load_from_disk` reads them in).
/// `None` for any other directory.
pub fn hf_data_files(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    let state = dir.join("state.json");
    let text = match super::read_file_if_exists(&state) {
        Ok(Some(t)) => t,
        Ok(None) => return Ok(None),
        Err(e) => return Err(Error::io(&state, e)),
    };
    let Some(names) = hf_state_files(&text, &state.display().to_string())? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let p = dir.join(name);
        if !p.is_file() {
            return Err(Error::NotFound {
                path: p.display().to_string(),
                what: format!("listed in {} but missing", state.display()),
            });
        }
        out.push(absolute(&p)?);
    }
    Ok(Some(out))
}

/// The data file names an HF `datasets` `state.json` (`text`, read from `state`: a path or
/// URL) lists, in its order; `None` without `_data_files` (not a `save_to_disk` state). Local
/// directories and bucket prefixes both read it here.
pub(crate) fn hf_state_files(text: &[u8], state: &str) -> Result<Option<Vec<String>>> {
    let bad =
        |what: String| Error::Config(format!("{state}: not an HF datasets state.json ({what})"));
    let v: serde_json::Value = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
    let Some(files) = v.get("_data_files") else {
        return Ok(None);
    };
    let files = files
        .as_array()
        .ok_or_else(|| bad("_data_files is not a list".into()))?;
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let name = f
            .get("filename")
            .and_then(|n| n.as_str())
            .ok_or_else(|| bad("an entry of _data_files has no filename".into()))?;
        if name.contains('/') || name.contains('\\') || name.starts_with('.') {
            return Err(bad(format!(
                "data file name {name:?} is not a plain file name"
            )));
        }
        out.push(name.to_string());
    }
    if v.get("_indices_data_files")
        .and_then(|x| x.as_array())
        .is_some_and(|a| !a.is_empty())
    {
        return Err(bad(
            "it has an indices mapping: save it with flatten_indices() first".into(),
        ));
    }
    Ok(Some(out))
}

/// What `load_dataset` (and `save_to_disk`) write beside the data: the dataset's features and
/// splits. In a directory without `state.json` it marks a `load_dataset` cache directory.
pub(crate) const HF_INFO: &str = "dataset_info.json";

/// What `DatasetDict.save_to_disk` writes at the top, beside one directory per split.
pub(crate) const HF_DICT: &str = "dataset_dict.json";

/// An HF `DatasetDict.save_to_disk` directory (`dir`, a path or URL, holding the entries
/// `names`; `subdirs`: its subdirectories, one per split) would mix its splits if read as one
/// stream: an error naming them and one split's directory to read instead. Told by the names
/// alone, as [`hf_cache_skips`] is.
pub(crate) fn refuse_hf_dict(dir: &str, names: &[&str], subdirs: &[&str]) -> Result<()> {
    if !names.contains(&HF_DICT) {
        return Ok(());
    }
    let pick = if subdirs.contains(&"train") {
        "train"
    } else {
        subdirs.first().copied().unwrap_or("train")
    };
    Err(Error::Config(format!(
        "{dir}: an HF datasets DatasetDict directory (save_to_disk) holding the splits {}: read \
         as one stream they would be mixed; name one split's directory, e.g. {}/{pick}",
        subdirs.join(", "),
        dir.trim_end_matches('/'),
    )))
}

/// The builder and split of a `load_dataset` data file, from its name: `{builder}-{split}.{ext}`
/// or `{builder}-{split}-{shard:05d}-of-{num_shards:05d}.{ext}` (HF `datasets`' `naming`;
/// split names are `\w+(\.\w+)*`, so never contain `-`). `None` for other names.
fn hf_split_of(name: &str) -> Option<(&str, &str)> {
    let (stem, _ext) = name.rsplit_once('.')?;
    // `-00000-of-00003`: 15 bytes, digits where the shard numbers are.
    let is_shard_suffix = |t: &[u8]| {
        t.len() == 15
            && t[0] == b'-'
            && t[1..6].iter().all(u8::is_ascii_digit)
            && &t[6..10] == b"-of-"
            && t[10..].iter().all(u8::is_ascii_digit)
    };
    let stem = match stem.len().checked_sub(15) {
        Some(at) if stem.is_char_boundary(at) && is_shard_suffix(&stem.as_bytes()[at..]) => {
            &stem[..at]
        }
        _ => stem,
    };
    let (builder, split) = stem.rsplit_once('-')?;
    (!builder.is_empty() && !split.is_empty()).then_some((builder, split))
}

/// In an HF `datasets` directory (`dir`: a path or URL, holding the entries `names`; marked by
/// `dataset_info.json`), which shard files are not data: `None` when it is not one, else the
/// names to skip. Those are the `cache-*.arrow` files `.map()`, `.filter()` and the like write
/// beside the data (`cache-{fingerprint}.arrow`, `…_{rank:05d}_of_{n:05d}.arrow` with
/// `num_proc`): other rows, or indices. In a `load_dataset` cache directory (no `state.json`)
/// the files of several splits are an error naming them, as train and test read as one stream
/// would be mixed; a `save_to_disk` directory (`state.json`) holds one split. Decided from the
/// names alone, so that a bucket prefix is told by its listing, without a GET.
pub(crate) fn hf_cache_skips<'a>(dir: &str, names: &[&'a str]) -> Result<Option<Vec<&'a str>>> {
    if !names.contains(&HF_INFO) {
        return Ok(None);
    }
    let mut skip = Vec::new();
    // split -> (builder, extension, a file name) of one of its files, for the error
    let mut splits: BTreeMap<&str, (&str, &str, &str)> = BTreeMap::new();
    for &name in names {
        if !is_shard_name(Path::new(name)) {
            continue;
        }
        if name.starts_with("cache-") && name.ends_with(".arrow") {
            skip.push(name);
        } else if let Some((builder, split)) = hf_split_of(name) {
            let ext = name.rsplit_once('.').map_or("", |(_, e)| e);
            splits.entry(split).or_insert((builder, ext, name));
        }
    }
    if splits.len() > 1 && !names.contains(&"state.json") {
        let list: Vec<&str> = splits.keys().copied().collect();
        let pick = if splits.contains_key("train") {
            "train"
        } else {
            list[0]
        };
        // The split's one file, or its shards' pattern: `{builder}-{split}*` would also match
        // a split named like it and longer (`train_extra`, `train.clean`).
        let (builder, ext, file) = splits[pick];
        let what = if file == format!("{builder}-{pick}.{ext}") {
            format!("its file, {}/{file}", dir.trim_end_matches('/'))
        } else {
            format!(
                "its shards with a glob, {}/{builder}-{pick}-?????-of-?????.{ext}",
                dir.trim_end_matches('/')
            )
        };
        return Err(Error::Config(format!(
            "{dir}: an HF datasets load_dataset cache directory holding the splits {}: read \
             as one stream they would be mixed; name one split's files, e.g. {what}",
            list.join(", "),
        )));
    }
    Ok(Some(skip))
}

/// Expand files, directories (every `*.parquet` below, recursively) and globs into a sorted,
/// de-duplicated list of absolute file paths. Anything that names nothing is an error naming it.
pub fn resolve_sources(sources: &[String]) -> Result<Vec<PathBuf>> {
    if sources.is_empty() {
        return Err(Error::Config(
            "no source given: pass a file, directory or glob".into(),
        ));
    }
    // One HF `datasets` directory: its files in state.json's order, not sorted.
    if let [one] = sources {
        let p = Path::new(one);
        if p.is_dir() {
            if let Some(files) = hf_data_files(p)? {
                if files.is_empty() {
                    return Err(Error::NotFound {
                        path: one.clone(),
                        what: "state.json lists no data files".into(),
                    });
                }
                return Ok(files);
            }
        }
    }
    let mut out = BTreeSet::new();
    for src in sources {
        let before = out.len();
        let p = Path::new(src);
        // An existing path is a path, even if its name has glob characters (`part[1].parquet`).
        if has_glob_chars(src) && std::fs::symlink_metadata(p).is_err() {
            let entries =
                glob::glob(src).map_err(|e| Error::Config(format!("bad glob {src:?}: {e}")))?;
            for entry in entries {
                let p =
                    entry.map_err(|e| Error::io(e.path(), std::io::Error::other(e.to_string())))?;
                if glob_skips(src, &p) {
                    continue;
                }
                match target_kind(&p)? {
                    Kind::Dir => walk_dir(&p, &mut out)?,
                    Kind::File => {
                        out.insert(absolute(&p)?);
                    }
                }
            }
            if out.len() == before {
                return Err(Error::NotFound {
                    path: src.clone(),
                    what: "no files match the glob".into(),
                });
            }
        } else {
            match target_kind(p)? {
                Kind::Dir => {
                    match hf_data_files(p)? {
                        Some(files) => out.extend(files),
                        None => walk_dir(p, &mut out)?,
                    }
                    if out.len() == before {
                        return Err(Error::NotFound {
                            path: src.clone(),
                            what: "no *.parquet, *.arrow, *.feather, *.arrows or *.ipc files \
                                   under the directory (names starting with '.' or '_' are \
                                   skipped)"
                                .into(),
                        });
                    }
                }
                Kind::File => {
                    out.insert(absolute(p)?);
                }
            }
        }
    }
    Ok(out.into_iter().collect())
}

/// Does the glob `pattern` skip its match `path`: a component below the pattern's literal
/// prefix that starts with `.` or `_` where the pattern does not spell that character.
fn glob_skips(pattern: &str, path: &Path) -> bool {
    let pat: Vec<&str> = pattern
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let base = pat.iter().take_while(|c| !has_glob_chars(c)).count();
    let comps: Vec<&std::ffi::OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s),
            Component::ParentDir => Some(std::ffi::OsStr::new("..")),
            _ => None,
        })
        .collect();
    let pat_rest = &pat[base.min(pat.len())..];
    let rest = &comps[base.min(comps.len())..];
    rest.iter().enumerate().any(|(i, c)| {
        if !is_hidden(c) {
            return false;
        }
        let first = c.as_encoded_bytes()[0] as char;
        let spelled = if rest.len() == pat_rest.len() {
            pat_rest[i].starts_with(first)
        } else {
            // `**` matched a varying depth: any component of the pattern spelling it will do.
            pat_rest.iter().any(|p| p.starts_with(first))
        };
        !spelled
    })
}

enum Kind {
    File,
    Dir,
}

/// What `path` is once symbolic links are followed; a broken link or a link loop is an error
/// naming the link (not the OS's bare "Too many levels of symbolic links").
fn target_kind(path: &Path) -> Result<Kind> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Ok(Kind::Dir),
        Ok(_) => Ok(Kind::File),
        Err(e) => Err(link_error(path, e)),
    }
}

fn link_error(path: &Path, e: std::io::Error) -> Error {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Error::io(path, e);
    }
    if e.kind() == std::io::ErrorKind::NotFound {
        let target = std::fs::read_link(path).unwrap_or_default();
        return Error::NotFound {
            path: path.display().to_string(),
            what: format!(
                "broken symbolic link (points to {}, which does not exist)",
                target.display()
            ),
        };
    }
    // ELOOP and the like: show the chain of links, up to where it repeats.
    let mut chain = vec![path.to_path_buf()];
    let mut at = path.to_path_buf();
    while let Ok(t) = std::fs::read_link(&at) {
        let next = at.parent().unwrap_or(Path::new("")).join(t);
        let repeats = chain.contains(&next);
        chain.push(next.clone());
        if repeats || chain.len() > 8 {
            break;
        }
        at = next;
    }
    let shown: Vec<String> = chain.iter().map(|p| p.display().to_string()).collect();
    Error::io(
        path,
        std::io::Error::new(
            e.kind(),
            format!("symbolic link loop ({}): {e}", shown.join(" -> ")),
        ),
    )
}

/// Absolute and lexically normalized (`a/./b/../c` -> `a/c`), so two spellings of one file are
/// one shard. Not `canonicalize`: following symlinks would rename shards in the fingerprint.
fn absolute(p: &Path) -> Result<PathBuf> {
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

/// Identity of a real directory (device, inode), to recognise it behind any link.
fn dir_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

fn walk_dir(dir: &Path, out: &mut BTreeSet<PathBuf>) -> Result<()> {
    let meta = std::fs::metadata(dir).map_err(|e| Error::io(dir, e))?;
    let mut ancestors = vec![dir_id(&meta)];
    walk(dir, out, &mut ancestors)
}

/// `ancestors`: the real directories on the way down to `dir` (itself included). A link to one
/// of them would make the walk loop forever (pyarrow and `os.walk(followlinks=True)` read every
/// file of such a tree ~40 times, until the OS refuses the path); any other directory is
/// walked as often as links lead to it, like explicitly listed sources.
fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>, ancestors: &mut Vec<(u64, u64)>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut entries = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if !is_hidden(&entry.file_name()) {
            entries.push(entry);
        }
    }
    // Sorted, so that which of two loop links is reported does not depend on the file system.
    entries.sort_by_key(|e| e.file_name());
    // HF `datasets` directories: a DatasetDict's splits are not one stream, and the
    // `.map()`/`.filter()` caches beside a split's files are not data.
    let names: Vec<std::ffi::OsString> = entries.iter().map(|e| e.file_name()).collect();
    let utf8: Vec<&str> = names.iter().filter_map(|n| n.to_str()).collect();
    let shown = dir.display().to_string();
    if utf8.contains(&HF_DICT) {
        // (only then: a stat of every entry of every directory walked would be wasted)
        let subdirs: Vec<&str> = (entries.iter().zip(&names))
            .filter(|(e, _)| e.path().is_dir())
            .filter_map(|(_, n)| n.to_str())
            .collect();
        refuse_hf_dict(&shown, &utf8, &subdirs)?;
    }
    let skip = hf_cache_skips(&shown, &utf8)?.unwrap_or_default();
    if !skip.is_empty() {
        entries.retain(|e| e.file_name().to_str().is_none_or(|n| !skip.contains(&n)));
    }
    for entry in entries {
        let path = entry.path();
        let ft = entry.file_type().map_err(|e| Error::io(&path, e))?;
        let is_parquet = is_shard_name(&path);
        if ft.is_dir() {
            let meta = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?;
            ancestors.push(dir_id(&meta));
            walk(&path, out, ancestors)?;
            ancestors.pop();
        } else if ft.is_symlink() {
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                // A broken or looping link is only an error if it claims to be a shard.
                Err(e) if is_parquet => return Err(link_error(&path, e)),
                Err(_) => continue,
            };
            if meta.is_dir() {
                let id = dir_id(&meta);
                if ancestors.contains(&id) {
                    let target = std::fs::read_link(&path).unwrap_or_default();
                    return Err(Error::io(
                        &path,
                        std::io::Error::other(format!(
                            "symbolic link to {}, a directory that contains it: walking it \
                             would read every file below it again, forever; remove the link, \
                             or list the directories to read",
                            target.display()
                        )),
                    ));
                }
                ancestors.push(id);
                walk(&path, out, ancestors)?;
                ancestors.pop();
            } else if is_parquet {
                out.insert(absolute(&path)?);
            }
        } else if is_parquet {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"x").unwrap();
    }

    fn names(dir: &Path, got: &[PathBuf]) -> Vec<String> {
        got.iter()
            .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
            .collect()
    }

    /// A Spark output directory: only the committed part file is data.
    #[test]
    fn walks_skip_hidden_and_temporary_names_but_explicit_files_are_read() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for f in [
            "part-00000.parquet",
            "sub/part-00001.parquet",
            "_temporary/0/_temporary/attempt_1/part-00000.parquet",
            ".hidden.parquet",
            "_SUCCESS",
            ".part-00000.parquet.crc",
            "_common_metadata.parquet",
            ".staging/part-00009.parquet",
        ] {
            touch(&root.join(f));
        }
        let got = resolve_sources(&[root.display().to_string()]).unwrap();
        assert_eq!(
            names(root, &got),
            ["part-00000.parquet", "sub/part-00001.parquet"]
        );
        // Named explicitly: read.
        let hidden = root.join(".hidden.parquet").display().to_string();
        let got = resolve_sources(std::slice::from_ref(&hidden)).unwrap();
        assert_eq!(names(root, &got), [".hidden.parquet"]);
        // A directory named explicitly is walked even if its own name starts with '.' or '_'
        // (but not what is hidden below it).
        let staging = root.join(".staging").display().to_string();
        assert_eq!(resolve_sources(&[staging]).unwrap().len(), 1);
        let tmp = root.join("_temporary").display().to_string();
        assert!(matches!(
            resolve_sources(&[tmp]),
            Err(Error::NotFound { .. })
        ));
        // Globs skip them unless the pattern spells the character.
        let g = format!("{}/*.parquet", root.display());
        assert_eq!(
            names(root, &resolve_sources(&[g]).unwrap()),
            ["part-00000.parquet"]
        );
        let g = format!("{}/**/*.parquet", root.display());
        assert_eq!(
            names(root, &resolve_sources(&[g]).unwrap()),
            ["part-00000.parquet", "sub/part-00001.parquet"]
        );
        let g = format!("{}/_*.parquet", root.display());
        assert_eq!(
            names(root, &resolve_sources(&[g]).unwrap()),
            ["_common_metadata.parquet"]
        );
        let g = format!("{}/.*.parquet", root.display());
        assert_eq!(
            names(root, &resolve_sources(&[g]).unwrap()),
            [".hidden.parquet"]
        );
    }

    #[test]
    fn an_existing_path_with_glob_characters_is_a_path() {
        let d = tempfile::tempdir().unwrap();
        touch(&d.path().join("part[1].parquet"));
        touch(&d.path().join("part1.parquet"));
        let src = d.path().join("part[1].parquet").display().to_string();
        let got = resolve_sources(&[src]).unwrap();
        assert_eq!(names(d.path(), &got), ["part[1].parquet"]);
        // Not an existing path: still a glob.
        let src = d.path().join("part[12].parquet").display().to_string();
        let got = resolve_sources(&[src]).unwrap();
        assert_eq!(names(d.path(), &got), ["part1.parquet"]);
    }

    #[test]
    fn a_directory_link_loop_is_an_error_naming_the_link() {
        let d = tempfile::tempdir().unwrap();
        touch(&d.path().join("sub/a.parquet"));
        symlink("..", d.path().join("sub/up")).unwrap();
        let err = resolve_sources(&[d.path().display().to_string()]).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Io { .. }), "{msg}");
        assert!(
            msg.contains("sub/up") && msg.contains("contains it"),
            "{msg}"
        );
        assert!(msg.len() < 400, "{msg}");
    }

    #[test]
    fn links_to_other_directories_are_followed() {
        let d = tempfile::tempdir().unwrap();
        touch(&d.path().join("real/a.parquet"));
        std::fs::create_dir(d.path().join("data")).unwrap();
        symlink("../real", d.path().join("data/linked")).unwrap();
        let got = resolve_sources(&[d.path().join("data").display().to_string()]).unwrap();
        assert_eq!(names(d.path(), &got), ["data/linked/a.parquet"]);
    }

    #[test]
    fn broken_and_looping_file_links_are_errors_naming_them() {
        let d = tempfile::tempdir().unwrap();
        touch(&d.path().join("a.parquet"));
        symlink("y.parquet", d.path().join("x.parquet")).unwrap();
        symlink("x.parquet", d.path().join("y.parquet")).unwrap();
        let err = resolve_sources(&[d.path().display().to_string()]).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("symbolic link loop") && msg.contains("x.parquet"),
            "{msg}"
        );
        assert!(msg.len() < 400, "{msg}");
        let err = resolve_sources(&[d.path().join("y.parquet").display().to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link loop"), "{err}");

        let d = tempfile::tempdir().unwrap();
        touch(&d.path().join("a.parquet"));
        symlink("gone.parquet", d.path().join("b.parquet")).unwrap();
        symlink("gone.txt", d.path().join("notes.txt")).unwrap();
        let err = resolve_sources(&[d.path().display().to_string()]).unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("broken symbolic link"), "{err}");
    }

    #[test]
    fn hf_cache_dirs_skip_map_caches_and_refuse_several_splits() {
        assert_eq!(hf_split_of("json-train.arrow"), Some(("json", "train")));
        assert_eq!(
            hf_split_of("my-set-validation-00001-of-00003.arrow"),
            Some(("my-set", "validation"))
        );
        assert_eq!(hf_split_of("data.arrow"), None);
        let skips = |names: &[&str]| hf_cache_skips("d", names).map(|s| s.map(|v| v.len()));
        let caches = [
            "dataset_info.json",
            "json-train-00000-of-00002.arrow",
            "json-train-00001-of-00002.arrow",
            "cache-0123456789abcdef.arrow",
            "cache-0123456789abcdef_00001_of_00002.arrow",
        ];
        assert_eq!(hf_cache_skips("d", &caches).unwrap().unwrap()[0], caches[3]);
        assert_eq!(skips(&caches).unwrap(), Some(2));
        // a save_to_disk directory (its data: data-*.arrow) skips its caches too; plain
        // directories are read as they are
        let saved = [
            "dataset_info.json",
            "state.json",
            "data-00000-of-00001.arrow",
            caches[3],
        ];
        assert_eq!(hf_cache_skips("d", &saved).unwrap(), Some(vec![caches[3]]));
        assert_eq!(skips(&caches[1..]).unwrap(), None);
        let err = skips(&[&caches[..], &["json-test.arrow"]].concat()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("splits test, train") && msg.contains("d/json-train-?????-of-?????.arrow"),
            "{msg}"
        );
        // one file: named exactly, as `json-train*` would also match `json-train_extra.arrow`
        let names = [
            "dataset_info.json",
            "json-train.arrow",
            "json-train_extra.arrow",
        ];
        let msg = skips(&names).unwrap_err().to_string();
        assert!(msg.ends_with("its file, d/json-train.arrow"), "{msg}");
    }
}
