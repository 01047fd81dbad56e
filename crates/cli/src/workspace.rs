//! Shipping the working tree: the files git would track (or a pattern walk outside git), zipped.

use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};

const SKIP_DIRS: &[&str] = &[
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "node_modules",
    "target",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
];
const MAX_BUNDLE: usize = 25 << 20;

fn git_files(dir: &Path) -> Option<Vec<PathBuf>> {
    let out = std::process::Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ])
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        out.stdout
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| PathBuf::from(String::from_utf8_lossy(s).into_owned()))
            .collect(),
    )
}

fn walk(dir: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir.join(rel))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        let ft = e.file_type()?;
        let r = rel.join(&name);
        if ft.is_dir() {
            if !SKIP_DIRS.contains(&name.as_str()) {
                walk(dir, &r, out)?;
            }
        } else if ft.is_file() && !name.ends_with(".pyc") {
            out.push(r);
        }
        if out.len() > 100_000 {
            break;
        }
    }
    Ok(())
}

/// Zips the workspace; returns the archive and the number of files.
pub fn bundle(
    dir: &Path,
    include: &[String],
    exclude: &[String],
) -> anyhow::Result<(Vec<u8>, usize)> {
    let mut files = match git_files(dir) {
        Some(f) => f,
        None => {
            let mut v = Vec::new();
            walk(dir, Path::new(""), &mut v)
                .with_context(|| format!("listing {}", dir.display()))?;
            v
        }
    };
    let mut ex = Vec::new();
    for e in exclude {
        ex.push(regex_lite(e)?);
    }
    files.retain(|f| {
        let s = f.to_string_lossy();
        !f.components()
            .any(|c| SKIP_DIRS.contains(&c.as_os_str().to_string_lossy().as_ref()))
            && !ex.iter().any(|r| r(&s))
            && (include.is_empty() || include.iter().any(|g| glob_match(g, &s)))
            && dir.join(f).is_file()
    });
    files.sort();
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let mut total = 0usize;
    for f in &files {
        let data =
            std::fs::read(dir.join(f)).with_context(|| format!("reading {}", f.display()))?;
        total += data.len();
        if total > MAX_BUNDLE * 4 {
            anyhow::bail!("workspace is too large to ship (over {} MiB before compression); use --exclude or --no-bundle", (MAX_BUNDLE * 4) >> 20);
        }
        w.start_file(f.to_string_lossy(), opts)?;
        w.write_all(&data)?;
    }
    let zip = w.finish()?.into_inner();
    if zip.len() > MAX_BUNDLE {
        anyhow::bail!("workspace bundle is {} bytes, over the 25 MiB limit; use --exclude REGEX or --no-bundle", zip.len());
    }
    Ok((zip, files.len()))
}

type Matcher = Box<dyn Fn(&str) -> bool>;

/// `--exclude` takes a substring or simple pattern (`*` wildcards).
fn regex_lite(p: &str) -> anyhow::Result<Matcher> {
    let p = p.to_string();
    Ok(Box::new(move |s: &str| {
        glob_match(&p, s) || s.contains(p.trim_matches('*'))
    }))
}

/// Glob with `*` (any run of characters).
fn glob_match(pat: &str, s: &str) -> bool {
    let parts: Vec<&str> = pat.split('*').collect();
    if parts.len() == 1 {
        return pat == s || s.ends_with(&format!("/{pat}"));
    }
    let mut rest = s;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        match rest.find(part) {
            Some(idx) => {
                if i == 0 && idx != 0 {
                    return false;
                }
                rest = &rest[idx + part.len()..];
            }
            None => return false,
        }
    }
    parts
        .last()
        .map(|l| l.is_empty() || s.ends_with(l))
        .unwrap_or(true)
}
