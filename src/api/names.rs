//! Kubernetes' own rules for names, label values and annotation keys, as the API server applies
//! them (`k8s.io/apimachinery/pkg/util/validation`), so that admission can refuse a spec whose
//! derived objects the API server would refuse later, one Pod patch at a time.
//!
//! Each check returns what is wrong in words a user can act on; the caller names the field.

/// Longest DNS-1035 / DNS-1123 label: a Service name, a label value, a hostname.
pub const MAX_LABEL: usize = 63;
/// Longest DNS-1123 subdomain: most object names, an annotation key's prefix.
pub const MAX_SUBDOMAIN: usize = 253;

/// A DNS-1035 label (a Service name): lowercase letters, digits and `-`, starting with a letter,
/// ending with a letter or digit, at most 63 characters.
pub fn dns1035_label(value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_LABEL {
        return Err(format!("must be 1 to {MAX_LABEL} characters long"));
    }
    let starts_with_letter = value.starts_with(|c: char| c.is_ascii_lowercase());
    if !starts_with_letter || !dns_label_chars(value) {
        return Err(
            "must consist of lowercase letters, digits and '-', start with a letter and end with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A DNS-1123 label (a namespace's name): lowercase letters, digits and `-`, starting and ending
/// with a letter or digit, at most 63 characters.
pub fn dns1123_label(value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_LABEL {
        return Err(format!("must be 1 to {MAX_LABEL} characters long"));
    }
    if !dns_label_chars(value) {
        return Err(
            "must consist of lowercase letters, digits and '-', and start and end with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A DNS-1123 subdomain (most object names): dot-separated DNS-1123 labels, at most 253 long.
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_SUBDOMAIN {
        return Err(format!("must be 1 to {MAX_SUBDOMAIN} characters long"));
    }
    if !value.split('.').all(dns_label_chars) {
        return Err(
            "must consist of lowercase letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_` and `.`, starting and ending
/// with a letter or digit.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > MAX_LABEL {
        return Err(format!("must be at most {MAX_LABEL} characters long"));
    }
    if !qualified_part(value) {
        return Err(
            "must consist of letters, digits, '-', '_' and '.', and start and end with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A key of a Secret or ConfigMap: at most 253 letters, digits, `-`, `_` and `.`.
pub fn secret_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_SUBDOMAIN {
        return Err(format!("must be 1 to {MAX_SUBDOMAIN} characters long"));
    }
    if !key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("must consist of letters, digits, '-', '_' and '.'".into());
    }
    Ok(())
}

/// A label or annotation key: an optional DNS-1123 subdomain prefix and `/`, then a name of at
/// most 63 letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit.
pub fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        dns1123_subdomain(prefix).map_err(|problem| format!("its prefix {prefix:?} {problem}"))?;
    }
    if name.is_empty() || name.len() > MAX_LABEL {
        return Err(format!(
            "its name part must be 1 to {MAX_LABEL} characters long"
        ));
    }
    if !qualified_part(name) {
        return Err(
            "its name part must consist of letters, digits, '-', '_' and '.', and start and end with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// Lowercase alphanumerics and `-`, starting and ending with an alphanumeric (the length is
/// the caller's: a subdomain's parts have no limit of their own, only the whole).
fn dns_label_chars(part: &str) -> bool {
    !part.is_empty()
        && part
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !part.starts_with('-')
        && !part.ends_with('-')
}

/// Alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric.
fn qualified_part(part: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_alphanumeric();
    part.chars()
        .all(|c| alphanumeric(c) || matches!(c, '-' | '_' | '.'))
        && part.starts_with(alphanumeric)
        && part.ends_with(alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_start_with_a_letter_and_fit_a_label() {
        assert!(dns1035_label("orders").is_ok());
        assert!(dns1035_label("a-1").is_ok());
        for bad in ["", "1abc", "Orders", "a_b", "a.b", "abc-", &"a".repeat(64)] {
            assert!(dns1035_label(bad).is_err(), "{bad:?} passed");
        }
        assert!(dns1035_label(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn subdomains_are_dotted_labels() {
        assert!(dns1123_subdomain("example.com").is_ok());
        assert!(dns1123_subdomain("1a.b-c").is_ok());
        for bad in ["", "a..b", ".a", "a.", "A.b", "a_b", &"a".repeat(254)] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad:?} passed");
        }
        // As Kubernetes' IsDNS1123Subdomain: no limit per part, 253 in all.
        assert!(dns1123_subdomain(&"a".repeat(200)).is_ok());
    }

    #[test]
    fn label_values_may_be_empty_but_not_odd() {
        for good in ["", "eu-west-1a", "A_b.c", "9"] {
            assert!(label_value(good).is_ok(), "{good:?} refused");
        }
        for bad in ["-a", "a-", "a b", "é", "a/b", &"a".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn annotation_keys_are_qualified_names() {
        for good in [
            "team",
            "example.com/team",
            "a.b/C_d-e.f",
            "prometheus.io/scrape",
        ] {
            assert!(qualified_name(good).is_ok(), "{good:?} refused");
        }
        for bad in [
            "bad key!",
            "",
            "/name",
            "prefix/",
            "Example.com/x",
            "a/b/c",
            "-x",
            &format!("{}/x", "a".repeat(254)),
            &"n".repeat(64),
        ] {
            assert!(qualified_name(bad).is_err(), "{bad:?} passed");
        }
    }
}
