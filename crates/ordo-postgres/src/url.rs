//! Connection URLs as text: which strings are URLs, where their host
//! part starts, and showing them without their secrets.

/// The schemes of a connection URL.
const URL_SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

/// Whether `text` is a connection URL: it starts with `postgres://` or
/// `postgresql://`.
pub fn is_postgres_url(text: &str) -> bool {
    URL_SCHEMES.iter().any(|scheme| text.starts_with(scheme))
}

/// Where the host part of the connection URL `url` starts: after its
/// scheme and its user part, which ends at the first `@` (a password may
/// hold `?` or `/`), as the client's parser reads it. `None` when `url`
/// is not a connection URL.
pub fn url_host_start(url: &str) -> Option<usize> {
    let scheme_end = URL_SCHEMES
        .iter()
        .find(|scheme| url.starts_with(*scheme))?
        .len();
    Some(
        url[scheme_end..]
            .find('@')
            .map_or(scheme_end, |at| scheme_end + at + 1),
    )
}

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
