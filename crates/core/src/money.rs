//! Dollar amounts as people write budgets: `$2.50`, `$0.125`, `$0.0049`.

/// Returns a dollar amount with cents always (`$0.50`, `$2.00`) and more digits only when the
/// amount has them (`$0.125`, `$0.0049`): a budget is never shown rounded to a number it is not.
pub fn usd(amount: f64) -> String {
    let cents = format!("{amount:.2}");
    if cents.parse::<f64>().ok() == Some(amount) {
        format!("${cents}")
    } else {
        format!("${amount}")
    }
}

#[cfg(test)]
mod tests {
    use super::usd;

    #[test]
    fn cents_always_and_finer_digits_kept() {
        assert_eq!(usd(2.5), "$2.50");
        assert_eq!(usd(10.0), "$10.00");
        assert_eq!(usd(0.125), "$0.125");
        assert_eq!(usd(0.0049), "$0.0049");
        assert_eq!(usd(12.125), "$12.125");
        assert_eq!(usd(0.0421), "$0.0421");
        assert_eq!(usd(0.0), "$0.00");
    }
}
