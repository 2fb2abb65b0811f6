//! The PostGIS helpers over geometries as PostgreSQL prints them (EWKB in hex) and as plain
//! WKB: every geometry type, Z and M, an SRID, big-endian bytes, empty geometries, and bytes
//! that are not a geometry.

use serde_json::json;

use super::{Case, Request};

/// WKB bytes, written in hex.
struct Wkb(String);

impl Wkb {
    /// A header: byte order (`true`: little-endian) and type code, then the SRID if any.
    fn new(little: bool, code: u32, srid: Option<u32>) -> Self {
        let mut w = Wkb(String::new());
        w.0.push_str(if little { "01" } else { "00" });
        w.u32(little, code);
        if let Some(s) = srid {
            w.u32(little, s);
        }
        w
    }

    fn u32(&mut self, little: bool, v: u32) -> &mut Self {
        let b = if little {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        };
        b.iter().for_each(|x| self.0.push_str(&format!("{x:02x}")));
        self
    }

    fn f64s(&mut self, little: bool, vs: &[f64]) -> &mut Self {
        for v in vs {
            let b = if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            };
            b.iter().for_each(|x| self.0.push_str(&format!("{x:02x}")));
        }
        self
    }

    fn raw(&mut self, hex: &str) -> &mut Self {
        self.0.push_str(hex);
        self
    }
}

fn point(x: f64, y: f64) -> String {
    Wkb::new(true, 1, None).f64s(true, &[x, y]).0.clone()
}

fn geometries() -> Vec<(&'static str, String)> {
    let line = |code: u32, pts: &[[f64; 2]]| {
        let mut w = Wkb::new(true, code, None);
        w.u32(true, pts.len() as u32);
        pts.iter().for_each(|p| {
            w.f64s(true, p);
        });
        w.0
    };
    let mut polygon = Wkb::new(true, 3, None);
    polygon.u32(true, 2).u32(true, 4);
    polygon.f64s(true, &[0.0, 0.0, 10.0, 0.0, 10.0, 10.0, 0.0, 0.0]);
    polygon
        .u32(true, 4)
        .f64s(true, &[1.0, 1.0, 2.0, 1.0, 2.0, 2.0, 1.0, 1.0]);
    let polygon = polygon.0;
    let mut multipoint = Wkb::new(true, 4, None);
    multipoint
        .u32(true, 2)
        .raw(&point(1.5, -2.0))
        .raw(&point(3.0, 4.25));
    let mut multiline = Wkb::new(true, 5, None);
    multiline
        .u32(true, 2)
        .raw(&line(2, &[[0.0, 0.0], [1.0, 1.0]]))
        .raw(&line(2, &[[2.0, 2.0], [3.0, 0.1]]));
    let mut multipolygon = Wkb::new(true, 6, None);
    multipolygon.u32(true, 1).raw(&polygon);
    let mut collection = Wkb::new(true, 7, None);
    collection
        .u32(true, 2)
        .raw(&point(7.0, 8.0))
        .raw(&line(2, &[[0.0, 1.0], [2.0, 3.0]]));
    let mut ewkb_point = Wkb::new(true, 0x2000_0001, Some(4326));
    ewkb_point.f64s(true, &[-122.4194, 37.7749]);
    let mut ewkb_z = Wkb::new(true, 0xA000_0001, Some(4326));
    ewkb_z.f64s(true, &[1.0, 2.0, 3.5]);
    let mut iso_zm = Wkb::new(true, 3001, None);
    iso_zm.f64s(true, &[1.0, 2.0, 3.0, 4.0]);
    let mut iso_m_line = Wkb::new(true, 2002, None);
    iso_m_line
        .u32(true, 2)
        .f64s(true, &[0.0, 0.0, 5.0, 1.0, 1.0, 6.0]);
    let mut big = Wkb::new(false, 1, None);
    big.f64s(false, &[0.5, 1e21]);
    let mut ewkb_multi_z = Wkb::new(true, 0xA000_0004, Some(3857));
    let mut inner = Wkb::new(true, 0x8000_0001, None);
    inner.f64s(true, &[1.0, 2.0, 3.0]);
    ewkb_multi_z.u32(true, 1).raw(&inner.0);
    vec![
        ("point", point(1.0, 2.0)),
        ("point-fraction", point(0.1, -0.000001)),
        ("line", line(2, &[[0.0, 0.0], [1.5, 2.5], [3.0, 4.0]])),
        ("line-empty", line(2, &[])),
        ("polygon", polygon),
        ("multipoint", multipoint.0.clone()),
        ("multiline", multiline.0.clone()),
        ("multipolygon", multipolygon.0.clone()),
        ("collection", collection.0.clone()),
        (
            "collection-empty",
            Wkb::new(true, 7, None).u32(true, 0).0.clone(),
        ),
        ("ewkb-point", ewkb_point.0.clone()),
        ("ewkb-point-z", ewkb_z.0.clone()),
        ("ewkb-multipoint-z", ewkb_multi_z.0.clone()),
        ("iso-point-zm", iso_zm.0.clone()),
        ("iso-line-m", iso_m_line.0.clone()),
        ("big-endian", big.0.clone()),
        ("upper-case-hex", point(1.0, 2.0).to_uppercase()),
    ]
}

/// Every geometry case: the helpers in both formats, and bytes that are not a geometry.
pub fn all() -> Vec<Case> {
    let select =
        "SELECT id, st_astext(g) AS t, st_asgeojson(g) AS j, st_x(g) AS x, st_y(g) AS y FROM t";
    let mut out = Vec::new();
    for (name, yaml) in [
        (
            "geometry/definition",
            format!("config:\n  edition: 2\nbucket_definitions:\n  b:\n    data:\n      - {select}\n"),
        ),
        (
            "geometry/stream",
            format!("config:\n  edition: 3\nstreams:\n  s:\n    auto_subscribe: true\n    query: {select}\n"),
        ),
    ] {
        let mut c = Case::new(name, yaml);
        for (id, hex) in geometries() {
            c = c.row("t", &[("id", "text", Some(id)), ("g", "text", Some(&hex))]);
        }
        out.push(
            c.row("t", &[("id", "text", Some("null")), ("g", "text", None)])
                .request(Request::claims(json!({"sub": "u1"}))),
        );
    }
    out.push(
        Case::new(
            "geometry/empty-point",
            format!("config:\n  edition: 2\nbucket_definitions:\n  b:\n    data:\n      - {select}\n"),
        )
        .row("t", &[("id", "text", Some("e")), ("g", "text", Some(&point(f64::NAN, f64::NAN)))])
        .differs(
            "row 0",
            "st_x of an empty point (NaN coordinates) is NaN, which the official service writes into the row's JSON (not JSON); here null, as for reals that overflow",
        ),
    );
    out.push(
        Case::new(
            "geometry/not-a-geometry",
            format!("config:\n  edition: 2\nbucket_definitions:\n  b:\n    data:\n      - {select}\n"),
        )
        .row("t", &[("id", "text", Some("x")), ("g", "text", Some("0101"))])
        .differs(
            "row 0",
            "bytes that are not a geometry fail the row in the official evaluator (an exception); here the helpers give NULL",
        ),
    );
    out
}
