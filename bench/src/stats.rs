//! Medians with min and max, formatted for tables.

/// Median, min and max of a sample set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

/// Summarises `values`; `None` when empty.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    Some(Summary {
        median,
        min: v[0],
        max: v[v.len() - 1],
        n: v.len(),
    })
}

impl Summary {
    /// `median (min–max, n=N)` with `unit` and `digits` decimals.
    pub fn show(&self, unit: &str, digits: usize) -> String {
        format!(
            "{:.d$} {unit} ({:.d$}–{:.d$}, n={})",
            self.median,
            self.min,
            self.max,
            self.n,
            d = digits
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_sets() {
        assert_eq!(summarize(&[3.0, 1.0, 2.0]).map(|s| s.median), Some(2.0));
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]).expect("non-empty");
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
        assert!(summarize(&[]).is_none());
    }
}
