//! `sluice-proto-gen [--check] REPO_ROOT`: compiles proto/sluice/v1/worker.proto with protox and writes
//! the tonic/prost code and the encoded descriptor set (served by gRPC reflection) to
//! sidecar/src/queue/grpc/generated/. With `--check` it writes nothing and fails when the checked-in
//! files differ from what it would write.

use std::{fs, path::PathBuf, process::ExitCode};

use prost::Message;

const PROTO: &str = "sluice/v1/worker.proto";
const OUT: &str = "sidecar/src/queue/grpc/generated";
/// What tonic-prost-build names the code of package `sluice.v1`, and the descriptor set's file.
const CODE: &str = "sluice.v1.rs";
const DESCRIPTOR: &str = "sluice.v1.bin";

fn main() -> ExitCode {
    let mut check = false;
    let mut root = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" => check = true,
            _ => root = Some(PathBuf::from(arg)),
        }
    }
    let Some(root) = root else {
        eprintln!("usage: sluice-proto-gen [--check] REPO_ROOT");
        return ExitCode::from(2);
    };
    match run(&root, check) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("{OUT} is stale: run proto/update.sh");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Generates; true when the checked-in files are (now) up to date.
fn run(root: &std::path::Path, check: bool) -> Result<bool, Box<dyn std::error::Error>> {
    let fds = protox::compile([PROTO], [root.join("proto")])?;
    let tmp = tempfile::tempdir()?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(tmp.path())
        .compile_fds(fds.clone())?;
    let code = fs::read_to_string(tmp.path().join(CODE))?;
    // Source positions (the comments' too) would tie the descriptor to the .proto's layout; reflection
    // needs none of them, and the generated code carries the comments.
    let mut fds = fds;
    for f in &mut fds.file {
        f.source_code_info = None;
    }
    let descriptor = fds.encode_to_vec();

    let out = root.join(OUT);
    let same = fs::read_to_string(out.join(CODE)).is_ok_and(|c| c == code)
        && fs::read(out.join(DESCRIPTOR)).is_ok_and(|d| d == descriptor);
    if check || same {
        return Ok(same);
    }
    fs::create_dir_all(&out)?;
    fs::write(out.join(CODE), code)?;
    fs::write(out.join(DESCRIPTOR), descriptor)?;
    Ok(true)
}
