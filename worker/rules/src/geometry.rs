//! The PostGIS helpers (`st_asgeojson`, `st_astext`, `st_x`, `st_y`) as the official evaluator
//! has them: a geometry is WKB or PostGIS's EWKB (a blob, or text in hex, as PostgreSQL
//! prints a geometry), read as the `wkx` package reads it, and written as its WKT and
//! GeoJSON writers write it (numbers as JavaScript prints them). A geometry that cannot be
//! read makes the official evaluator fail the row; here the function gives NULL.

use super::js_number::js_number;
use super::json::push_jsonbig_number;
use super::value::Value;

/// One coordinate; `z` and `m` as the geometry's header declared them.
#[derive(Debug, Clone, Copy)]
struct Coord {
    x: f64,
    y: f64,
    z: Option<f64>,
    m: Option<f64>,
}

/// What a geometry holds.
#[derive(Debug)]
enum Shape {
    Point(Coord),
    LineString(Vec<Coord>),
    /// Rings: the exterior one first.
    Polygon(Vec<Vec<Coord>>),
    MultiPoint(Vec<Geometry>),
    MultiLineString(Vec<Geometry>),
    MultiPolygon(Vec<Geometry>),
    Collection(Vec<Geometry>),
}

/// A geometry with the dimensions its header declared.
#[derive(Debug)]
struct Geometry {
    shape: Shape,
    has_z: bool,
    has_m: bool,
}

/// The bytes of a geometry value: a blob, or text in hex (read up to its first pair that is
/// not hex, as Node's `Buffer.from(text, 'hex')` reads it).
fn bytes_of(v: &Value<'_>) -> Option<Vec<u8>> {
    match v {
        Value::Blob(b) => Some(b.to_vec()),
        Value::Text(t) => {
            let b = t.as_bytes();
            let mut out = Vec::with_capacity(b.len() / 2);
            for pair in b.chunks_exact(2) {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(pair[0]), hex(pair[1])) {
                    (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                    _ => break,
                }
            }
            Some(out)
        }
        _ => None,
    }
}

/// `st_asgeojson(geometry)`.
pub(crate) fn as_geojson(v: &Value<'_>) -> Value<'static> {
    parse(v).map_or(Value::Null, |g| {
        let mut out = String::new();
        g.geojson(&mut out);
        Value::Text(out.into())
    })
}

/// `st_astext(geometry)`.
pub(crate) fn as_text(v: &Value<'_>) -> Value<'static> {
    parse(v).map_or(Value::Null, |g| Value::Text(g.wkt().into()))
}

/// `st_x(geometry)` (`y`: `st_y`): a point's coordinate, NULL for any other geometry.
pub(crate) fn point_coordinate(v: &Value<'_>, y: bool) -> Value<'static> {
    match parse(v).map(|g| g.shape) {
        Some(Shape::Point(c)) => Value::Real(if y { c.y } else { c.x }),
        _ => Value::Null,
    }
}

fn parse(v: &Value<'_>) -> Option<Geometry> {
    let bytes = bytes_of(v)?;
    let mut r = Reader {
        b: &bytes,
        i: 0,
        big_endian: false,
        depth: 0,
    };
    r.geometry(false)
}

/// How deep collections may nest: a row's bytes must not exhaust the stack (the official
/// evaluator's recursion fails the row sooner or later too).
const MAX_DEPTH: usize = 32;

/// The bytes being read: one position and one byte order for the whole value (a nested
/// geometry's header sets the order for what follows it, as in `wkx`).
struct Reader<'b> {
    b: &'b [u8],
    i: usize,
    big_endian: bool,
    depth: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let bytes: [u8; N] = self.b.get(self.i..self.i + N)?.try_into().ok()?;
        self.i += N;
        Some(bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.take::<4>()?;
        Some(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    fn f64(&mut self) -> Option<f64> {
        let b = self.take::<8>()?;
        Some(if self.big_endian {
            f64::from_be_bytes(b)
        } else {
            f64::from_le_bytes(b)
        })
    }

    fn coord(&mut self, has_z: bool, has_m: bool) -> Option<Coord> {
        let (x, y) = (self.f64()?, self.f64()?);
        let z = if has_z { Some(self.f64()?) } else { None };
        let m = if has_m { Some(self.f64()?) } else { None };
        Some(Coord { x, y, z, m })
    }

    fn coords(&mut self, has_z: bool, has_m: bool) -> Option<Vec<Coord>> {
        let n = self.u32()?;
        (0..n).map(|_| self.coord(has_z, has_m)).collect()
    }

    fn geometries(&mut self, ewkb: bool) -> Option<Vec<Geometry>> {
        let n = self.u32()?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        let all = (0..n).map(|_| self.geometry(ewkb)).collect();
        self.depth -= 1;
        all
    }

    /// One geometry: its header (byte order, type, EWKB flags and SRID), then its body;
    /// `parent_ewkb`: it is nested in an EWKB geometry.
    fn geometry(&mut self, parent_ewkb: bool) -> Option<Geometry> {
        self.big_endian = self.take::<1>()?[0] == 0;
        let code = self.u32()?;
        let ewkb = code & 0xE000_0000 != 0;
        if code & 0x2000_0000 != 0 {
            self.u32()?; // the SRID: no output shows it
        }
        let (kind, has_z, has_m) = if !ewkb && !parent_ewkb {
            match code {
                1000..=1999 => (code - 1000, true, false),
                2000..=2999 => (code - 2000, false, true),
                3000..=3999 => (code - 3000, true, true),
                _ => (code, false, false),
            }
        } else {
            (code & 0xF, code & 0x8000_0000 != 0, code & 0x4000_0000 != 0)
        };
        let nested = ewkb || parent_ewkb;
        let shape = match kind {
            1 => Shape::Point(self.coord(has_z, has_m)?),
            2 => Shape::LineString(self.coords(has_z, has_m)?),
            3 => {
                let rings = self.u32()?;
                Shape::Polygon(
                    (0..rings)
                        .map(|_| self.coords(has_z, has_m))
                        .collect::<Option<_>>()?,
                )
            }
            4 => Shape::MultiPoint(self.geometries(nested)?),
            5 => Shape::MultiLineString(self.geometries(nested)?),
            6 => Shape::MultiPolygon(self.geometries(nested)?),
            7 => Shape::Collection(self.geometries(nested)?),
            _ => return None,
        };
        Some(Geometry {
            shape,
            has_z,
            has_m,
        })
    }
}

impl Geometry {
    fn wkt_type(&self, name: &str, empty: bool) -> String {
        let mut out = name.to_owned();
        match (self.has_z, self.has_m) {
            (true, true) => out.push_str(" ZM "),
            (true, false) => out.push_str(" Z "),
            (false, true) => out.push_str(" M "),
            (false, false) if empty => out.push(' '),
            _ => {}
        }
        if empty {
            out.push_str("EMPTY");
        }
        out
    }

    /// A coordinate as `wkx` writes it: the dimensions this geometry declares.
    fn wkt_coord(&self, c: &Coord) -> String {
        let mut out = format!("{} {}", js_number(c.x), js_number(c.y));
        for (declared, v) in [(self.has_z, c.z), (self.has_m, c.m)] {
            if declared {
                out.push(' ');
                out.push_str(&v.map_or("undefined".to_owned(), js_number));
            }
        }
        out
    }

    fn ring_wkt(&self, ring: &[Coord]) -> String {
        let parts: Vec<String> = ring.iter().map(|c| self.wkt_coord(c)).collect();
        format!("({})", parts.join(","))
    }

    /// The parenthesized body of a line string or a polygon (a member of a multi-geometry).
    fn inner_wkt(&self) -> String {
        match &self.shape {
            Shape::LineString(points) => self.ring_wkt(points),
            Shape::Polygon(rings) => {
                let parts: Vec<String> = rings.iter().map(|r| self.ring_wkt(r)).collect();
                format!("({})", parts.join(","))
            }
            _ => String::new(),
        }
    }

    fn wkt(&self) -> String {
        let list = |name: &str, parts: Vec<String>| {
            if parts.is_empty() {
                self.wkt_type(name, true)
            } else {
                format!("{}({})", self.wkt_type(name, false), parts.join(","))
            }
        };
        match &self.shape {
            Shape::Point(c) => format!("{}({})", self.wkt_type("POINT", false), self.wkt_coord(c)),
            Shape::LineString(points) if points.is_empty() => self.wkt_type("LINESTRING", true),
            Shape::LineString(_) => {
                format!("{}{}", self.wkt_type("LINESTRING", false), self.inner_wkt())
            }
            Shape::Polygon(rings) if rings.first().is_none_or(Vec::is_empty) => {
                self.wkt_type("POLYGON", true)
            }
            Shape::Polygon(_) => format!("{}{}", self.wkt_type("POLYGON", false), self.inner_wkt()),
            Shape::MultiPoint(points) => list(
                "MULTIPOINT",
                points
                    .iter()
                    .map(|p| match &p.shape {
                        Shape::Point(c) => self.wkt_coord(c),
                        _ => String::new(),
                    })
                    .collect(),
            ),
            Shape::MultiLineString(lines) => list(
                "MULTILINESTRING",
                lines.iter().map(Geometry::inner_wkt).collect(),
            ),
            Shape::MultiPolygon(polygons) => list(
                "MULTIPOLYGON",
                polygons.iter().map(Geometry::inner_wkt).collect(),
            ),
            Shape::Collection(all) => list(
                "GEOMETRYCOLLECTION",
                all.iter().map(Geometry::wkt).collect(),
            ),
        }
    }

    /// GeoJSON as `wkx` builds it and the official service's JSON writer writes it.
    fn geojson(&self, out: &mut String) {
        let (name, key) = match &self.shape {
            Shape::Point(_) => ("Point", "coordinates"),
            Shape::LineString(_) => ("LineString", "coordinates"),
            Shape::Polygon(_) => ("Polygon", "coordinates"),
            Shape::MultiPoint(_) => ("MultiPoint", "coordinates"),
            Shape::MultiLineString(_) => ("MultiLineString", "coordinates"),
            Shape::MultiPolygon(_) => ("MultiPolygon", "coordinates"),
            Shape::Collection(_) => ("GeometryCollection", "geometries"),
        };
        out.push_str(&format!("{{\"type\":\"{name}\",\"{key}\":"));
        match &self.shape {
            Shape::Collection(all) => json_list(out, all, |out, g| g.geojson(out)),
            _ => self.coordinates(out),
        }
        out.push('}');
    }

    /// The `coordinates` array of a geometry other than a collection.
    fn coordinates(&self, out: &mut String) {
        let with_z = self.has_z;
        match &self.shape {
            // A point's own `z` decides (`wkx` reads it from the point).
            Shape::Point(c) => position(out, c, c.z.is_some()),
            Shape::LineString(points) => json_list(out, points, |out, c| position(out, c, with_z)),
            // An empty exterior ring is left out; interior rings never are.
            Shape::Polygon(rings) => {
                let kept = rings.first().is_some_and(Vec::is_empty) as usize;
                json_list(out, &rings[kept..], |out, r| {
                    json_list(out, r, |out, c| position(out, c, with_z))
                })
            }
            Shape::MultiPoint(items)
            | Shape::MultiLineString(items)
            | Shape::MultiPolygon(items)
            | Shape::Collection(items) => json_list(out, items, |out, g| g.coordinates(out)),
        }
    }
}

/// `[a,b,…]`, each item written by `item`.
fn json_list<T>(out: &mut String, items: &[T], mut item: impl FnMut(&mut String, &T)) {
    out.push('[');
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        item(out, x);
    }
    out.push(']');
}

/// `[x,y]` or `[x,y,z]` as the official service's JSON writer writes numbers (an undefined
/// `z`: `null`).
fn position(out: &mut String, c: &Coord, with_z: bool) {
    out.push('[');
    push_jsonbig_number(out, c.x);
    out.push(',');
    push_jsonbig_number(out, c.y);
    if with_z {
        out.push(',');
        match c.z {
            Some(z) => push_jsonbig_number(out, z),
            None => out.push_str("null"),
        }
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collections nested deeper than [`MAX_DEPTH`] are not read (a row cannot exhaust the
    /// stack), and a count larger than the bytes fails without allocating for it.
    #[test]
    fn hostile_bytes_end_in_null() {
        let nested = "010700000001000000".repeat(10_000);
        assert_eq!(as_text(&Value::Text(nested.into())), Value::Null);
        let huge = "0102000000ffffffff";
        assert_eq!(as_text(&Value::Text(huge.into())), Value::Null);
        let point = "0101000000000000000000f03f0000000000000040";
        assert_eq!(
            as_text(&Value::Text(point.into())),
            Value::Text("POINT(1 2)".into())
        );
    }
}
