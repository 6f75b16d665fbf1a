"""Polygon geometry of BPSP (Gu et al. 2015): half-planes, convex clipping with
labelled facets, and the GEOS overlays (unions, differences) on a fixed precision grid,
with repairs on coarser grids where GEOS gives up."""

from __future__ import annotations

import math

import numpy as np
import shapely
import shapely.geometry
from shapely.geometry import Polygon, box

GRID = 1e-12  # precision grid of shapely's unions and overlays (parameters are O(1))
REPAIR_GRIDS = (1e-10, 1e-8)  # coarser grids tried when GEOS gives up on GRID


def overlay(op, *geoms, diag=None):
    """``op(*geoms)`` (a shapely set operation) on the precision grid GRID. On thin,
    nearly coincident regions GEOS can still give up ("TopologyException: unable to
    assign free hole to a shell", seen on breast-cancer fold 0); the inputs are then
    repaired (make_valid) and snapped to a coarser grid (a shift of 1e-10 in lambda or
    eta, far below any region's width that matters), and the repair is counted in
    ``diag.geometry_repairs``."""
    try:
        return op(*geoms, grid_size=GRID)
    except shapely.errors.GEOSException as e:
        err = e
    for grid in REPAIR_GRIDS:
        fixed = [shapely.set_precision(shapely.make_valid(g), grid) for g in geoms]
        try:
            out = op(*fixed, grid_size=grid)
        except shapely.errors.GEOSException as e:
            err = e
            continue
        if diag is not None:
            diag.geometry_repairs += 1
        return out
    raise err


def halfplanes(abc, bounds):
    """Polygons of the half-planes a x + b y <= c (rows of ``abc``) over the region
    ``bounds``: shapely has no half-plane type, so each is a square with one side on
    the line, large enough to hold the bounds."""
    abc = np.atleast_2d(np.asarray(abc, float))
    out = np.empty(len(abc), dtype=object)
    out[:] = [_halfplane(a, b, c, bounds) for a, b, c in abc.tolist()]
    return out


def _halfplane(a, b, c, bounds):
    """One half-plane of :func:`halfplanes` (scalar arithmetic: a handful are needed
    at a time, where numpy's per-call overhead dominated)."""
    x0, y0, x1, y1 = bounds
    extent = max(x1 - x0, y1 - y0, 1e-12)
    norm = math.hypot(a, b)
    if norm < 1e-300:  # 0 <= c: everything; otherwise nothing
        if c >= 0:
            return box(x0 - extent, y0 - extent, x1 + extent, y1 + extent)
        return Polygon()
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    ux, uy = a / norm, b / norm  # unit normal, towards the violated side
    dist = (a * mx + b * my - c) / norm
    qx, qy = mx - dist * ux, my - dist * uy  # mid projected onto the line
    dx, dy = -uy, ux
    L = 2.0 * extent + abs(dist) + 1.0
    p, q = (qx - L * dx, qy - L * dy), (qx + L * dx, qy + L * dy)
    ring = [p, q, (q[0] - L * ux, q[1] - L * uy), (p[0] - L * ux, p[1] - L * uy), p]
    return shapely.polygons(np.array(ring))


def clip(poly, ineq, tol):
    """poly cut by the inequalities a . x <= c + tol. Returns the cut polygon and the
    inequalities not already met at every vertex of ``poly`` (a convex poly meets
    those everywhere; the others are the candidates for its facets). The cuts are
    made one half-plane at a time, the deepest cut first, each against the current
    polygon's vertices: a region has a handful of edges, so a handful of cuts
    replaces an overlay of every candidate (5-8x less GEOS time)."""
    if poly.is_empty:
        return poly, np.zeros(0, int)
    V = shapely.get_coordinates(poly)[:-1]
    viol = (V @ ineq[:, :2].T - ineq[:, 2]) > tol
    active = np.flatnonzero(viol.any(axis=0))
    if len(active) == 0:
        return poly, active
    abc = ineq[active, :3].copy()
    abc[:, 2] += tol
    norm = np.maximum(np.hypot(abc[:, 0], abc[:, 1]), 1e-300)
    P, bounds = poly, poly.bounds
    # after its cut a line holds only up to rounding: never cut by it twice
    done = np.zeros(len(active), bool)
    for _ in range(len(active)):
        depth = (V @ abc[:, :2].T - abc[:, 2]).max(axis=0) / norm
        depth[done] = -np.inf
        k = int(np.argmax(depth))
        if depth[k] <= 0:
            break
        done[k] = True
        P = largest(shapely.intersection(P, _halfplane(*abc[k].tolist(), bounds)))
        if P is None:
            return Polygon(), active
        V = shapely.get_coordinates(P)[:-1]
    return P, active


def facets(poly, ineq, candidates, tol, across=None):
    """The candidate inequalities whose line carries an edge of ``poly`` (its
    compact representation within the piece it was cut from). With ``across`` (a
    distance), also a point that far beyond the middle of each such edge."""
    if poly.is_empty or len(candidates) == 0:
        return [] if across is None else ([], np.zeros((0, 2)))
    V = np.array(poly.exterior.coords)
    A = ineq[candidates]
    scale = np.maximum(np.abs(A[:, :2]).max(axis=1), 1e-300)
    slack = 1e3 * tol * np.maximum(1.0, np.abs(A[:, 2])) + tol * scale
    on = np.abs(V @ A[:, :2].T - A[:, 2]) <= slack  # vertices x candidates
    both = on[:-1] & on[1:]  # edges x candidates: two consecutive vertices on it
    edge = both.any(axis=0)
    out = [int(k) for k in np.asarray(candidates)[edge]]
    if across is None:
        return out
    e = both[:, edge].argmax(axis=0)  # an edge on each facet's line
    mid = (V[e] + V[e + 1]) / 2
    normal = A[edge, :2] / np.maximum(np.hypot(A[edge, 0], A[edge, 1]), 1e-300)[:, None]
    # no farther than a thousandth of the edge: small regions have small neighbours
    dist = np.minimum(across, 1e-3 * np.hypot(*(V[e + 1] - V[e]).T))
    return out, mid + dist[:, None] * normal


def dissolve(pairs, diag=None):
    """[(value, polygon)] -> {value: union of its polygons}."""
    groups: dict = {}
    for v, g in pairs:
        groups.setdefault(round(v, 12), []).append(g)
    # a fixed precision grid makes GEOS's overlay robust: in floating precision the
    # union of wedges meeting at one point (all regions meet at C = 0) lost 3% of
    # its area
    return {
        v: polygonal(overlay(shapely.union_all, gs, diag=diag))
        for v, gs in groups.items()
    }


def superpose(maps, diag=None):
    """Sum of piecewise-constant maps {value: geometry} over the same rectangle: the
    exact K-fold total for every parameter pair, dissolved by value."""
    total = maps[0]
    for m in maps[1:]:
        pairs = []
        for v1, g1 in total.items():
            for v2, g2 in m.items():
                if not g1.intersects(g2):
                    continue
                inter = polygonal(overlay(shapely.intersection, g1, g2, diag=diag))
                if inter.area > 0:
                    pairs.append((v1 + v2, inter))
        total = dissolve(pairs, diag)
    return total


def polygonal(geom):
    """The polygons of a geometry as one (Multi)Polygon: snapping to the precision
    grid can leave collapsed slivers as lines or points."""
    polys = parts(geom)
    if len(polys) == 1:
        return polys[0]
    return shapely.MultiPolygon(polys) if polys else Polygon()


def parts(geom):
    """The polygons (of positive area) of a geometry."""
    if geom is None or geom.is_empty:
        return []
    parts = getattr(geom, "geoms", [geom])
    return [g for g in parts if g.geom_type == "Polygon" and g.area > 0]


def vertices_ccw(poly):
    """The exterior vertices of a polygon, counter-clockwise, without the closing
    repeat (the compiled kernels' form)."""
    ring = shapely.get_exterior_ring(shapely.orient_polygons(poly))
    return np.ascontiguousarray(shapely.get_coordinates(ring)[:-1], dtype=float)


def stack_polygons(verts, offs):
    """One (vertices, offsets) pair from several: polygon r of part k is
    verts[k][offs[k][r]:offs[k][r + 1]]; the offsets of later parts are shifted by
    the vertices before them."""
    out, base = [np.zeros(1, np.int64)], 0
    for v, o in zip(verts, offs, strict=True):
        out.append(np.asarray(o[1:], np.int64) + base)
        base += len(v)
    vert = np.concatenate(verts) if len(verts) else np.zeros((0, 2))
    return np.ascontiguousarray(vert, float), np.concatenate(out)


def polygons_of(vert, off):
    """The polygons vert[off[r]:off[r + 1]] (each of 3 vertices or more, not closed)
    as an array of shapely Polygons, built by GEOS in one call: the same geometries
    as one Polygon(...) each, 4-5x faster (0.42 -> 0.09 s for 50,000)."""
    off = np.asarray(off, np.int64)
    if len(off) < 2:
        return np.empty(0, dtype=object)
    which = np.repeat(np.arange(len(off) - 1), np.diff(off))
    rings = shapely.linearrings(vert[off[0] : off[-1]], indices=which)
    return shapely.polygons(rings)


def convex_pieces(geom):
    """A polygonal geometry as convex polygons (counter-clockwise vertex arrays):
    each part as it is where it is convex, else its constrained Delaunay triangles
    (regions that gave up an overlap to earlier ones can be non-convex)."""
    out = []
    for part in parts(geom):
        hull = part.convex_hull.area
        if not part.interiors and part.area >= hull * (1 - 1e-12):
            out.append(vertices_ccw(part))
            continue
        for tri in parts(shapely.constrained_delaunay_triangles(part)):
            out.append(vertices_ccw(tri))
    return out


def largest(geom):
    if geom is None or geom.is_empty:
        return None
    if geom.geom_type == "Polygon":
        return geom
    parts = [g for g in getattr(geom, "geoms", []) if g.geom_type == "Polygon"]
    return max(parts, key=lambda g: g.area) if parts else None
