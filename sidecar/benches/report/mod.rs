//! What every benchmark's report needs: tool versions, and its own section of BENCHMARKS.md.

use std::{ffi::OsStr, path::Path, process::Command};

/// The first line `program args` prints (stdout, else stderr: `nginx -v` writes there), or `?`.
pub fn version_of(program: impl AsRef<OsStr>, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() { o.stderr } else { o.stdout };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("?")
                .trim()
                .to_owned()
        })
        .unwrap_or_else(|_| "?".into())
}

/// The CPU model, from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "?".into())
}

/// The 1, 5 and 15 minute load averages, space separated.
pub fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Replaces the section between `start` and `end` of BENCHMARKS.md (at the workspace root) with
/// `section` (which carries both markers), or appends it.
pub fn write_section(start: &str, end: &str, section: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let new = match (old.find(start), old.find(end)) {
        (Some(a), Some(b)) if b > a => {
            format!("{}{}{}", &old[..a], section.trim_end(), &old[b + end.len()..])
        }
        _ => format!("{}\n{}", old.trim_end().to_owned() + "\n", section),
    };
    std::fs::write(&path, new).expect("write BENCHMARKS.md");
    eprintln!("wrote {}", path.display());
}
