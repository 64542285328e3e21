//! Reading one value out of Prometheus text, so a test that checks a metric fails when the
//! series is missing (renamed, never registered, wrong labels) instead of reading it as 0.

/// The value of the series `name{labels}` in Prometheus text, or `None` if there is no such
/// series. The labels must match exactly (all of them, in any order).
///
/// ```
/// let text = "# TYPE x_total counter\nx_total{cluster=\"a\",namespace=\"n\"} 2\n";
/// assert_eq!(harness::metric(text, "x_total", &[("namespace", "n"), ("cluster", "a")]), Some(2.0));
/// assert_eq!(harness::metric(text, "x_total", &[("cluster", "a")]), None);
/// ```
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut wanted: Vec<(&str, String)> = labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
    wanted.sort();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, mut found) = parse_series(series)?;
            found.sort();
            let same = series_name == name
                && found.len() == wanted.len()
                && found
                    .iter()
                    .zip(&wanted)
                    .all(|((k, v), (wk, wv))| k == wk && v == wv);
            if same {
                value.trim().parse().ok()
            } else {
                None
            }
        })
}

/// `name{a="x",b="y"}` (or a bare `name`) into the name and its label pairs, unescaped.
fn parse_series(series: &str) -> Option<(&str, Vec<(&str, String)>)> {
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series.trim(), Vec::new()));
    };
    let mut labels = Vec::new();
    let mut rest = rest.strip_suffix('}')?;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (at, '"') => break at,
                (_, other) => value.push(other),
            }
        };
        labels.push((key.trim_start_matches(',').trim(), value));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some((name, labels))
}

#[cfg(test)]
mod tests {
    use super::metric;

    const TEXT: &str = r#"# HELP valkey_operator_failovers_total Planned failovers issued, by cluster.
# TYPE valkey_operator_failovers_total counter
valkey_operator_failovers_total{cluster="cart",namespace="shop"} 2
valkey_operator_failovers_total{cluster="cart-2",namespace="shop"} 5
valkey_operator_reconcile_duration_seconds_count 17
odd{path="a \"quoted\", comma\\"} 1.5
"#;

    #[test]
    fn finds_a_series_by_name_and_exact_labels() {
        let failovers = "valkey_operator_failovers_total";
        let cart = [("cluster", "cart"), ("namespace", "shop")];
        assert_eq!(metric(TEXT, failovers, &cart), Some(2.0));
        assert_eq!(
            metric(
                TEXT,
                failovers,
                &[("namespace", "shop"), ("cluster", "cart-2")]
            ),
            Some(5.0)
        );
        assert_eq!(
            metric(
                TEXT,
                "valkey_operator_reconcile_duration_seconds_count",
                &[]
            ),
            Some(17.0)
        );
        assert_eq!(
            metric(TEXT, "odd", &[("path", r#"a "quoted", comma\"#)]),
            Some(1.5)
        );
    }

    #[test]
    fn a_missing_series_is_none_not_zero() {
        assert_eq!(
            metric(
                TEXT,
                "valkey_operator_failovers_total",
                &[("cluster", "other"), ("namespace", "shop")]
            ),
            None
        );
        assert_eq!(
            metric(
                TEXT,
                "valkey_operator_failovers_total",
                &[("cluster", "cart")]
            ),
            None
        );
        assert_eq!(
            metric(
                TEXT,
                "valkey_operator_failover_total",
                &[("cluster", "cart"), ("namespace", "shop")]
            ),
            None
        );
        assert_eq!(metric("", "anything", &[]), None);
    }
}
