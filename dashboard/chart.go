package dashboard

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
	"time"
)

// series is one line of a chart; Class picks its colour in ui.css.
type series struct {
	Name, Class string
	pts         []point
}

const (
	chartW, chartH = 560, 160
	padL, padR     = 64, 8
	padT, padB     = 8, 22
	plotW, plotH   = chartW - padL - padR, chartH - padT - padB
)

// chartSVG draws series over the window ending at now as an inline SVG (drawn
// here, from numbers only: no script, no styles inline, nothing from a row).
func chartSVG(label string, format func(float64) string, minTop float64, window time.Duration, now time.Time, ss ...series) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="%s">`, chartW, chartH, html.EscapeString(label))
	top := 0.0
	n := 0
	for _, s := range ss {
		for _, p := range s.pts {
			top = max(top, p.v)
			n++
		}
	}
	top = max(niceCeil(top), minTop)
	levels := gridLevels(top)
	from := now.Add(-window)
	x := func(t time.Time) float64 { return padL + plotW*t.Sub(from).Seconds()/window.Seconds() }
	y := func(v float64) float64 { return padT + plotH*(1-v/top) }
	for i := 0; i <= levels; i++ {
		v := top * float64(i) / float64(levels)
		fmt.Fprintf(&b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/>`, padL, chartW-padR, y(v), y(v))
		fmt.Fprintf(&b, `<text class="axis" x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y(v)+4, html.EscapeString(format(v)))
	}
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d">-%s</text>`, padL, chartH-4, shortDuration(window))
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d" text-anchor="end">now</text>`, chartW-padR, chartH-4)
	if n == 0 {
		fmt.Fprintf(&b, `<text class="empty" x="%d" y="%d" text-anchor="middle">no data yet</text>`, padL+plotW/2, padT+plotH/2)
	}
	for _, s := range ss {
		var pts []string
		for _, p := range s.pts {
			if p.at.Before(from) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p.at), y(p.v)))
		}
		if len(pts) == 1 {
			pts = append(pts, pts[0]) // a dot's worth of line
		}
		if len(pts) > 0 {
			fmt.Fprintf(&b, `<polyline class="line %s" points="%s"/>`, html.EscapeString(s.Class), strings.Join(pts, " "))
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built above from numbers and escaped constants
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten (1 for nothing at all).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// gridLevels splits 1, 2 or 5 times a power of ten into round steps.
func gridLevels(top float64) int {
	m := top / math.Pow(10, math.Floor(math.Log10(top)))
	if math.Abs(m-2) < 1e-9 {
		return 4
	}
	return 5
}

func shortDuration(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%dm", int(d/time.Minute))
	}
	return d.String()
}

// formatCount writes 1234567 as "1.2M", 12345 as "12.3k".
func formatCount(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return trimZero(fmt.Sprintf("%.1f", v/1e6)) + "M"
	case a >= 1e3:
		return trimZero(fmt.Sprintf("%.1f", v/1e3)) + "k"
	case a == math.Trunc(a):
		return fmt.Sprintf("%.0f", v)
	default:
		return trimZero(fmt.Sprintf("%.1f", v))
	}
}

// formatSeconds writes a latency: "850µs", "12ms", "1.5s".
func formatSeconds(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 1e-3:
		return fmt.Sprintf("%.0fµs", v*1e6)
	case v < 1:
		return trimZero(fmt.Sprintf("%.1f", v*1e3)) + "ms"
	default:
		return trimZero(fmt.Sprintf("%.1f", v)) + "s"
	}
}

func trimZero(s string) string { return strings.TrimSuffix(s, ".0") }
