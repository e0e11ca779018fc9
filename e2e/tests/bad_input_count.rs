//! The number of bad inputs Sluice's tests try, as docs/security.md reports it, counted from the tables
//! the tests run: a case added to (or removed from) a table changes the count, and this test fails until
//! the doc says so. Each table's own test checks its cases are distinct and runs every one of them.

#[allow(dead_code)] // only the tables are read here; the rest serves the owning test
#[path = "../../sidecar/tests/bad_input/http.rs"]
mod http;

#[allow(dead_code)] // only the tables are read here; the rest serves the owning test
#[path = "../../sidecar/tests/bad_input/config.rs"]
mod config;

#[allow(dead_code)] // only the tables are read here; the rest serves the owning test
#[path = "../../operator/tests/bad_input/annotations.rs"]
mod annotations;

#[allow(dead_code)] // only the tables are read here; the rest serves the owning test
#[path = "bad_input/crs.rs"]
mod crs;

use std::path::Path;

/// Each table, by its path in the repository, and its number of cases.
const TABLES: [(&str, usize); 4] = [
    ("sidecar/tests/bad_input/http.rs", http::CASES.len()),
    ("sidecar/tests/bad_input/config.rs", config::CASES.len()),
    (
        "operator/tests/bad_input/annotations.rs",
        annotations::CASES.len(),
    ),
    ("e2e/tests/bad_input/crs.rs", crs::CASES.len()),
];

/// The number in the first cell of the doc's table row that links `path`.
fn reported(doc: &str, path: &str) -> usize {
    let row = doc
        .lines()
        .find(|l| l.starts_with('|') && l.contains(&format!("(../{path})")))
        .unwrap_or_else(|| panic!("docs/security.md has no table row linking ../{path}"));
    number_in(row)
}

/// The first cell of a table row that is a number (bold or not).
fn number_in(row: &str) -> usize {
    row.split('|')
        .find_map(|cell| cell.trim().trim_matches('*').parse().ok())
        .unwrap_or_else(|| panic!("no number in {row:?}"))
}

#[test]
fn docs_security_md_reports_the_number_of_bad_inputs_the_tests_try() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md")).unwrap();
    let mut total = 0;
    for (path, cases) in TABLES {
        assert_eq!(
            reported(&doc, path),
            cases,
            "docs/security.md reports another number of cases for {path}"
        );
        total += cases;
    }
    let total_row = doc
        .lines()
        .find(|l| l.starts_with("| **total**"))
        .expect("docs/security.md's bad input table has a **total** row");
    assert_eq!(number_in(total_row), total, "the total in docs/security.md");
    assert!(
        doc.contains(&format!("**{total} distinct bad inputs**")),
        "docs/security.md does not say **{total} distinct bad inputs**"
    );
    assert!(total >= 200, "fewer than 200 bad inputs: {total}");
}
