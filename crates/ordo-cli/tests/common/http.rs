//! The HTTP side of a running console, as the console tests drive it:
//! pages fetched and forms posted with or without the console's origin.

use std::time::Duration;

use super::console::Console;

/// The HTTP side of a running console.
impl Console {
    pub fn get(&self, path: &str) -> Page {
        page(agent().get(&self.url(path)).call())
    }

    pub fn get_with_cookie(&self, path: &str, cookie: &str) -> Page {
        page(agent().get(&self.url(path)).header("Cookie", cookie).call())
    }

    /// POSTs `form` to `path` from the console's own origin.
    pub fn post_own(&self, path: &str, form: &[(&str, &str)]) -> Page {
        post(self, path, Some(&self.url("")), form)
    }

    pub fn login(&self, token: &str) -> Page {
        page(
            agent()
                .post(&self.url("/login"))
                .send_form([("token", token)]),
        )
    }
}

#[derive(Debug)]
pub struct Page {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub text: String,
}

impl Page {
    /// Asserts the page's status and a phrase of its text.
    #[track_caller]
    pub fn assert_says(&self, status: u16, phrase: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert!(self.text.contains(phrase), "{}", self.text);
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The text of the element carrying `data-metric="NAME"`.
    #[track_caller]
    pub fn metric(&self, name: &str) -> String {
        let marker = format!("data-metric=\"{name}\">");
        let start = self
            .text
            .find(&marker)
            .unwrap_or_else(|| panic!("no data-metric {name} in {}", self.text))
            + marker.len();
        let end = start + self.text[start..].find('<').expect("the element closes");
        self.text[start..end].to_owned()
    }

    /// The flows listed (their `data-flow` attributes), in order.
    pub fn flows(&self) -> Vec<String> {
        self.text
            .split("data-flow=\"")
            .skip(1)
            .map(|rest| rest[..rest.find('"').unwrap()].to_owned())
            .collect()
    }

    /// The target of the "Next page" link, if any.
    pub fn next(&self) -> Option<String> {
        let rest = &self.text[self.text.find("id=\"next\" href=\"")? + 16..];
        Some(rest[..rest.find('"').unwrap()].replace("&amp;", "&"))
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

pub fn page(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Page {
    let mut response = response.expect("the console answers");
    let headers = response
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    Page {
        status: response.status().as_u16(),
        headers,
        text: response.body_mut().read_to_string().expect("a text body"),
    }
}

/// The value of the hidden field `name` of the page's first form.
pub fn hidden(page: &Page, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let rest = &page.text[page.text.find(&marker)? + marker.len()..];
    Some(rest[..rest.find('"').unwrap()].to_owned())
}

pub fn post(console: &Console, path: &str, origin: Option<&str>, form: &[(&str, &str)]) -> Page {
    let mut request = agent().post(&console.url(path));
    if let Some(origin) = origin {
        request = request.header("Origin", origin);
    }
    page(request.send_form(form.iter().copied()))
}

/// Serves `app` on a free port of 127.0.0.1 from a thread of its own (a
/// provider, a partner's endpoint) for the rest of the test process; its
/// address.
pub fn serve_on_loopback(app: axum::Router) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    addr
}
