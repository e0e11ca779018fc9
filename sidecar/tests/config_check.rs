//! `sluice-sidecar --check-config FILE`: a bad config exits non-zero naming each field at fault; the
//! documented example passes.

use std::{io::Write, process::Command};

fn check(yaml: &str) -> (i32, String, String) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(yaml.as_bytes()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .arg("--check-config")
        .arg(f.path())
        .env_remove("SLUICE_UPSTREAM")
        .env_remove("SLUICE_LISTEN")
        .env_remove("SLUICE_REDIS_URL")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn rules(rule: &str) -> String {
    format!("version: 1\nlimits:\n  rules:\n  - {rule}\n")
}

#[test]
fn each_kind_of_bad_config_is_refused_naming_the_field_at_fault() {
    let ok_limit = "limit: {requests: 5, window: 1m}";
    let cases: Vec<(String, &str, &str)> = vec![
        ("version: 7\n".into(), "version", "reads version 1"),
        ("limits:\n  rulez: []\n".into(), "limits.rulez", "unknown field"),
        (
            "limits:\n  expectedReplicas: lots\n".into(),
            "limits.expectedReplicas",
            "invalid type",
        ),
        (
            "limits:\n  expectedReplicas: 0\n".into(),
            "limits.expectedReplicas",
            "at least 1",
        ),
        (
            "limits:\n  redis:\n    prefetch: 1000000\n".into(),
            "limits.redis.prefetch",
            "at most 100000",
        ),
        (
            "limits:\n  clientTimeouts:\n    idle: 0s\n".into(),
            "limits.clientTimeouts.idle",
            "longer than 0s",
        ),
        (
            "limits:\n  clientTimeouts:\n    requestHead: 48h\n".into(),
            "limits.clientTimeouts.requestHead",
            "at most",
        ),
        (
            rules(&format!("name: Bad_Name\n    {ok_limit}")),
            "limits.rules[0].name",
            "DNS label",
        ),
        (
            format!(
                "version: 1\nlimits:\n  rules:\n  - name: a\n    {ok_limit}\n  - name: a\n    {ok_limit}\n"
            ),
            "limits.rules[1].name",
            "unique",
        ),
        (
            rules("name: a\n    limit: {requests: 0, window: 1m}"),
            "limits.rules[0].limit.requests",
            "at least 1",
        ),
        (
            rules("name: a\n    limit: {requests: 1, window: 500ms}"),
            "limits.rules[0].limit.window",
            "between 1s and 1d",
        ),
        (
            rules("name: a\n    limit: {requests: 1, window: 25h}"),
            "limits.rules[0].limit.window",
            "between 1s and 1d",
        ),
        (
            rules("name: a\n    limit: {requests: 1, window: 5 minutes}"),
            "limits.rules[0].limit.window",
            "not a duration",
        ),
        (
            rules("name: a\n    limit: {requests: 1, window: 1m, burst: 5}"),
            "limits.rules[0].limit.burst",
            "only tokenBucket rules take a burst",
        ),
        (
            rules(&format!(
                "name: a\n    match: {{pathRegex: '(unclosed'}}\n    {ok_limit}"
            )),
            "limits.rules[0].match.pathRegex",
            "does not compile",
        ),
        (
            rules(&format!("name: a\n    match: {{methods: [get]}}\n    {ok_limit}")),
            "limits.rules[0].match.methods[0]",
            "not a known method",
        ),
        (
            rules(&format!(
                "name: a\n    match: {{headerPresent: 'bad header'}}\n    {ok_limit}"
            )),
            "limits.rules[0].match.headerPresent",
            "not a valid header name",
        ),
        (
            rules(&format!(
                "name: a\n    key: [{{type: clientIp, ipv4Prefix: 33}}]\n    {ok_limit}"
            )),
            "limits.rules[0].key[0].ipv4Prefix",
            "between 0 and 32",
        ),
        (
            rules(&format!(
                "name: a\n    key: [{{type: clientIp, ipv6Prefix: 129}}]\n    {ok_limit}"
            )),
            "limits.rules[0].key[0].ipv6Prefix",
            "between 0 and 128",
        ),
        (
            rules(&format!("name: a\n    key: [{{type: header}}]\n    {ok_limit}")),
            "limits.rules[0].key[0].name",
            "need a header name",
        ),
        (
            rules(&format!("name: a\n    algorithm: leakyFaucet\n    {ok_limit}")),
            "limits.rules[0].algorithm",
            "unknown variant",
        ),
        (
            "limits:\n  upstream: ftp://app:21\n".into(),
            "limits.upstream",
            "http://",
        ),
        (
            "limits:\n  redis: {url: 'memcached://x:1'}\n".into(),
            "limits.redis.url",
            "scheme",
        ),
        (
            "limits:\n  clientIp: {trustedProxies: [10.0.0.0/33]}\n".into(),
            "limits.clientIp.trustedProxies[0]",
            "invalid IP address",
        ),
        (
            "policy: {namespace: Shop, name: checkout}\n".into(),
            "policy.namespace",
            "namespace",
        ),
        (
            "queue:\n  queues: [emails, 'bad name!']\n".into(),
            "queue.queues[1]",
            "not a queue name",
        ),
        (
            "queue:\n  worker: {concurrency: 0}\n".into(),
            "queue.worker.concurrency",
            "at least 1",
        ),
        (
            "queue:\n  handler: {permanentFailureStatuses: [200]}\n".into(),
            "queue.handler.permanentFailureStatuses[0]",
            "not an HTTP error status",
        ),
    ];
    assert!(cases.len() >= 10);
    for (yaml, path, says) in cases {
        let (code, _, stderr) = check(&yaml);
        assert_eq!(code, 1, "accepted:\n{yaml}\n{stderr}");
        let line = stderr
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{path}:")))
            .unwrap_or_else(|| panic!("no line naming {path} for\n{yaml}\ngot:\n{stderr}"));
        assert!(line.contains(says), "{path}: expected {says:?} in {line:?}");
    }
}

#[test]
fn a_file_that_cannot_be_read_is_refused_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .args(["--check-config", "/nonexistent/sluice.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/sluice.yaml"));
}

#[test]
fn the_documented_examples_are_valid() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("sidecar") && name.ends_with(".yaml") {
            let (code, stdout, stderr) = check(&std::fs::read_to_string(&path).unwrap());
            assert_eq!(code, 0, "{name}: {stderr}");
            assert!(stdout.contains("valid"), "{stdout}");
            seen += 1;
        }
    }
    assert!(seen >= 1, "no examples/sidecar*.yaml found");
}
