//! Figures derived from what the lab measured, shared by its reports: the
//! spread of a measurement repeated during a run (F, F_pg, S_pg), a rate,
//! and a count per item. A report's own figures are methods of the report;
//! a caller only formats them.

/// The least, the median and the greatest of the repeated measurements of
/// one rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The least.
    pub min: f64,
    /// The median: of an even number of measurements, the upper of the two
    /// middle ones.
    pub median: f64,
    /// The greatest (never below 0: the measurements are rates).
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; of none, every figure 0.
    pub fn of(values: &[f64]) -> Spread {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let Some(&median) = sorted.get(sorted.len() / 2) else {
            return Spread {
                min: 0.0,
                median: 0.0,
                max: 0.0,
            };
        };
        Spread {
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            median,
            max: values.iter().copied().fold(0.0, f64::max),
        }
    }
}

/// `count` per second over `seconds` (a zero or negative time counts as a
/// nanosecond, so the rate stays finite).
pub fn per_second(count: u64, seconds: f64) -> f64 {
    count as f64 / seconds.max(1e-9)
}

/// `count` per item over `items` (none counts as one, so the figure stays
/// finite: 0 when nothing was counted).
pub fn per(count: u64, items: u64) -> f64 {
    count as f64 / items.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spread_is_the_least_the_median_and_the_greatest() {
        let spread = |min, median, max| Spread { min, median, max };
        let cases = [
            (vec![], spread(0.0, 0.0, 0.0)),
            (vec![812.5], spread(812.5, 812.5, 812.5)),
            (vec![3.0, 1.0, 2.0], spread(1.0, 2.0, 3.0)),
            // An even number: the upper of the two middle ones.
            (vec![4.0, 1.0, 3.0, 2.0], spread(1.0, 3.0, 4.0)),
            (vec![5.0, 5.0, 1.0, 5.0], spread(1.0, 5.0, 5.0)),
            (
                vec![812.4, 799.5, 1301.7, 640.2, 700.0],
                spread(640.2, 799.5, 1301.7),
            ),
            // Rates: the greatest is never below 0.
            (vec![-2.0, -1.0], spread(-2.0, -1.0, 0.0)),
        ];
        for (values, expected) in cases {
            assert_eq!(Spread::of(&values), expected, "{values:?}");
        }
    }

    #[test]
    fn rates_are_counts_over_seconds_and_stay_finite() {
        let cases = [
            (3000, 1.5, 2000.0),
            (1, 4.0, 0.25),
            (0, 2.0, 0.0),
            (0, 0.0, 0.0),
            (5, 0.0, 5e9),
            (5, -1.0, 5e9),
        ];
        for (count, seconds, rate) in cases {
            assert_eq!(per_second(count, seconds), rate, "{count} in {seconds} s");
        }
    }

    #[test]
    fn counts_per_item_stay_finite() {
        let cases = [
            (3, 12, 0.25),
            (12, 3, 4.0),
            (7, 0, 7.0),
            (0, 0, 0.0),
            (0, 5, 0.0),
        ];
        for (count, items, figure) in cases {
            assert_eq!(per(count, items), figure, "{count} per {items}");
        }
    }
}
