//! The web dashboard (docs/DASHBOARD.md): static files embedded in the binary and
//! served by the admin listener at `/` and `/ui/…`. They hold no data: the page
//! asks for the admin token once, keeps it in the tab's `sessionStorage`, and
//! calls the admin API with `Authorization: Bearer` like any client, so the API's
//! checks (token, `Host`, `Origin`, JSON bodies) stay as they are. No build step:
//! plain JavaScript and uPlot (MIT, vendored from its npm package, assets/uplot).

use weir_http::{Request, Response};

const INDEX: &str = include_str!("../assets/dashboard/index.html");
const APP_JS: &str = include_str!("../assets/dashboard/app.js");
const STYLE: &str = include_str!("../assets/dashboard/style.css");
const UPLOT_JS: &str = include_str!("../assets/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/uplot/uPlot.min.css");

/// The file at `request`'s path, for `GET`; `None`: not a dashboard file (the
/// admin API answers).
pub fn asset(request: &Request) -> Option<Response> {
    // HEAD as GET (hyper sends no body for it): it was a 401, although the
    // static files need no token.
    if request.method != "GET" && request.method != "HEAD" {
        return None;
    }
    let (content_type, body) = match request.path.as_str() {
        "/" | "/index.html" => ("text/html; charset=utf-8", INDEX),
        "/ui/app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "/ui/style.css" => ("text/css; charset=utf-8", STYLE),
        "/ui/uplot.js" => ("text/javascript; charset=utf-8", UPLOT_JS),
        "/ui/uplot.css" => ("text/css; charset=utf-8", UPLOT_CSS),
        _ => return None,
    };
    Some(Response::new(200, content_type, body.as_bytes().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HEAD is answered as GET (the static files need no token).
    #[test]
    fn head_is_answered_as_get() {
        let head = asset(&Request {
            method: "HEAD".into(),
            path: "/".into(),
            ..Request::default()
        });
        assert_eq!(head.map(|r| r.status), Some(200));
    }

    fn get(path: &str) -> Option<Response> {
        asset(&Request {
            method: "GET".into(),
            path: path.into(),
            ..Request::default()
        })
    }

    #[test]
    fn the_page_and_its_files_are_served_and_nothing_else() {
        let page = get("/").unwrap();
        assert!(page.content_type.starts_with("text/html"));
        let html = String::from_utf8(page.body).unwrap();
        for file in [
            "/ui/app.js",
            "/ui/style.css",
            "/ui/uplot.js",
            "/ui/uplot.css",
        ] {
            assert!(html.contains(file), "{file} not linked");
            assert_eq!(get(file).unwrap().status, 200);
        }
        assert!(get("/v1/volumes").is_none());
        assert!(get("/ui/../admin-token").is_none());
        let post = Request {
            method: "POST".into(),
            path: "/".into(),
            ..Request::default()
        };
        assert!(asset(&post).is_none());
    }
}
