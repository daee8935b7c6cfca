//! Showing a connection URL without its secrets.

/// `url` with the password of its user part and any `password` parameter
/// replaced by `***`. Works on the text alone, so that a URL that does not
/// parse is hidden as well.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // Everything before the last `@` is the user part (a password may hold
    // `/`, `?` or `@`): hiding too much is safe, too little is not.
    let (user_part, tail) = match rest.rfind('@') {
        Some(at) => {
            let user_info = &rest[..at];
            let shown = match user_info.split_once(':') {
                Some((user, _password)) => format!("{user}:***@"),
                None => format!("{user_info}@"),
            };
            (shown, &rest[at + 1..])
        }
        None => (String::new(), rest),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let params: Vec<String> = query
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => {
                        format!("{key}=***")
                    }
                    _ => param.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{user_part}{tail}")
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_hidden_wherever_they_are() {
        let cases = [
            ("postgres://u:secret@h:5432/d", "postgres://u:***@h:5432/d"),
            (
                "postgresql://u@h/d?password=secret&x=1",
                "postgresql://u@h/d?password=***&x=1",
            ),
            ("postgres://u:p@ss/w?rd@h/d", "postgres://u:***@h/d"),
            ("postgres://h/d", "postgres://h/d"),
            ("not a url", "not a url"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
