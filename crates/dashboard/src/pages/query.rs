//! The Query page: the admin's SQL box and the result table.

use super::layout::{error_box, Nav, Page};
use super::MAX_QUERY_ROWS;
use crate::api::Table;
use maud::html;

pub fn query_page(sql: &str, result: Option<Result<&Table, &str>>, elapsed_ms: f64) -> Page {
    let head = html! {
        h1 { "Query" }
        form.query method="get" action="/query" {
            label for="sql" { "SQL (one read-only SELECT against the controller DB)" }
            textarea #sql name="sql" rows="5" spellcheck="false" { (sql) }
            div.row {
                button type="submit" { "Run" }
                span.muted { "Example: SELECT state, count(*) FROM jobs GROUP BY state" }
            }
        }
    };
    let live = match result {
        None => html! {},
        Some(Err(e)) => error_box("Query failed:", e),
        Some(Ok(t)) => html! {
            p.muted {
                (t.rows.len()) " row(s) in " (format!("{elapsed_ms:.1}")) " ms"
                @if t.rows.len() > MAX_QUERY_ROWS { "; showing the first " (MAX_QUERY_ROWS) }
                "."
            }
            div.tablewrap { table.query {
                thead { tr { @for c in &t.columns { th scope="col" { (c) } } } }
                tbody {
                    @for r in t.rows.iter().take(MAX_QUERY_ROWS) {
                        tr { @for i in 0..t.columns.len() {
                            @let v = r.get(i).cloned().unwrap_or(serde_json::Value::Null);
                            @match v {
                                serde_json::Value::Null => td.muted { "NULL" },
                                serde_json::Value::Number(n) => td.num { (n) },
                                serde_json::Value::String(s) => td { (s) },
                                other => td { (other) },
                            }
                        } }
                    }
                }
            } }
        },
    };
    Page {
        title: "Query".into(),
        nav: Nav::Query,
        head,
        live,
        done: true,
        refresh: false,
    }
}
