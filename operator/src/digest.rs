//! Short, stable, non-secret names derived from text: hex digits of a SHA-256 prefix (annotation values,
//! object and role name suffixes, keys of endpoint URLs).

use sha2::{Digest, Sha256};

/// `bytes` as lower-case hex digits.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first `len` bytes of `data`'s SHA-256, as `2 * len` hex digits.
pub fn short_hash(data: &[u8], len: usize) -> String {
    hex(&Sha256::digest(data)[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_hash_is_the_hex_of_the_digest_s_first_bytes() {
        assert_eq!(hex(&[0x00, 0xab, 0x0f]), "00ab0f");
        // SHA-256("abc") begins ba7816bf.
        assert_eq!(short_hash(b"abc", 4), "ba7816bf");
        assert_eq!(short_hash(b"abc", 8).len(), 16);
    }
}
