//! The shapes of Kubernetes names, checked wherever a name arrives from outside: in sidecar configs,
//! pod annotations and queue names.

/// An RFC 1123 label: 1–63 lowercase letters, digits or `-`, starting and ending with a letter or digit.
/// What namespace names and rule names are.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// An RFC 1123 subdomain: labels joined by `.`, at most 253 bytes. What most Kubernetes object names are.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && !s.is_empty() && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        for ok in ["a", "shop", "a-1", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad:?}");
        }
        assert!(is_dns_subdomain("web.shop-1"));
        for bad in ["", "a..b", ".a", "a.", &"a.".repeat(127)] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
    }
}
