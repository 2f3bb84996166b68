//! The alert rules' and dashboard's PromQL and the metric names they use.

use super::*;

/// The `onceflow_*` metric names of a PromQL expression (identifiers outside quotes).
pub(super) fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = expr.chars().peekable();
    let mut quoted = None;
    while let Some(c) = chars.next() {
        if let Some(q) = quoted {
            if c == '\\' {
                chars.next();
            } else if c == q {
                quoted = None;
            }
        } else if c == '"' || c == '\'' || c == '`' {
            quoted = Some(c);
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut ident = c.to_string();
            while let Some(&n) = chars.peek() {
                if !(n.is_ascii_alphanumeric() || n == '_' || n == ':') {
                    break;
                }
                ident.push(n);
                chars.next();
            }
            if ident.starts_with("onceflow_") {
                names.insert(ident);
            }
        }
    }
    names
}

/// The catalogue name a series name belongs to: itself, or a histogram's `_bucket`, `_sum`
/// or `_count` series.
pub(super) fn catalogue_name(series: &str) -> Option<String> {
    let catalogue = job_catalogue();
    if catalogue.iter().any(|d| d.name == series) {
        return Some(series.to_string());
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = series.strip_suffix(suffix)?;
        catalogue
            .iter()
            .any(|d| d.name == base && d.kind == MetricKind::Histogram)
            .then(|| base.to_string())
    })
}

/// (alert name, expression) of every rule in the rules file.
pub(super) fn alert_rules() -> Vec<(String, String)> {
    let doc: Value = serde_norway::from_str(&read("prometheus/onceflow-alerts.yml")).unwrap();
    let mut rules = vec![];
    for group in doc["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .expect("alerting rules only")
                .to_string();
            rules.push((name, rule["expr"].as_str().expect("expr").to_string()));
        }
    }
    rules
}

/// (panel title, expression) of every dashboard query, the `$instance` variable at its
/// "All" value.
pub(super) fn dashboard_queries() -> Vec<(String, String)> {
    let dash: Value = serde_json::from_str(&read("grafana/onceflow-dashboard.json")).unwrap();
    let mut out = vec![];
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .expect("expr")
                .replace("$instance", ".+");
            assert!(
                !expr.contains('$'),
                "{}: a variable the test does not set: {expr}",
                panel["title"]
            );
            out.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    out
}

pub(super) fn uses_only_healthy_job_names(expr: &str) -> bool {
    metric_names(expr).iter().all(|n| {
        !NOT_ON_A_HEALTHY_TWO_PHASE_COMMIT_JOB
            .iter()
            .any(|(m, _)| m == n)
    })
}

// ---------------------------------------------------------------------------------------
// The static checks
// ---------------------------------------------------------------------------------------
