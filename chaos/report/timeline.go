// Package report draws a chaos run's timeline: throughput and latency of
// the acknowledged operations over time, with the nemesis windows shaded,
// as Jepsen's plots do.
package report

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"sort"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Sample is one completed operation: when it completed (since the run's
// start), how long it took, and whether it succeeded.
type Sample struct {
	At      time.Duration
	Latency time.Duration
	OK      bool
}

// Window is a nemesis window: a fault named Name active from From to To
// (since the run's start).
type Window struct {
	Name     string
	From, To time.Duration
}

// ErrNoSamples is returned by Timeline for a run without samples.
var ErrNoSamples = errors.New("report: no samples to plot")

// Timeline writes a PNG of two panels sharing the time axis: operations
// per second (ok and failed) and latency (p50, p99 and max per second, on
// a log scale), each with the windows shaded and named.
func Timeline(w io.Writer, title string, samples []Sample, windows []Window) error {
	if len(samples) == 0 {
		return ErrNoSamples
	}
	secs := bucket(samples)
	end := float64(len(secs))
	for _, win := range windows {
		end = math.Max(end, win.To.Seconds())
	}

	tp := plot.New()
	tp.Title.Text = title
	tp.Y.Label.Text = "operations / s"
	tp.X.Min, tp.X.Max = 0, end
	okPts, failPts := make(plotter.XYs, len(secs)), make(plotter.XYs, len(secs))
	maxRate := 1.0
	for i, s := range secs {
		okPts[i] = plotter.XY{X: float64(i) + 0.5, Y: float64(s.ok)}
		failPts[i] = plotter.XY{X: float64(i) + 0.5, Y: float64(s.failed)}
		maxRate = math.Max(maxRate, float64(s.ok+s.failed))
	}
	tp.Y.Min, tp.Y.Max = 0, maxRate*1.1
	if err := shade(tp, windows, 0, maxRate*1.1, false); err != nil {
		return err
	}
	if err := addLine(tp, okPts, color.RGBA{G: 128, A: 255}, "ok"); err != nil {
		return err
	}
	if err := addLine(tp, failPts, color.RGBA{R: 200, A: 255}, "failed or unknown"); err != nil {
		return err
	}
	tp.Legend.Top = true

	lp := plot.New()
	lp.X.Label.Text = "seconds since start"
	lp.Y.Label.Text = "latency (ms)"
	lp.Y.Scale = plot.LogScale{}
	lp.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	lp.X.Min, lp.X.Max = 0, end
	var p50, p99, pmax plotter.XYs
	hi, lo := 1.0, math.Inf(1)
	for i, s := range secs {
		if len(s.lat) == 0 {
			continue
		}
		q := func(p float64) float64 {
			return math.Max(float64(s.lat[min(len(s.lat)-1, int(p*float64(len(s.lat))))])/1e6, 0.01)
		}
		p50 = append(p50, plotter.XY{X: float64(i) + 0.5, Y: q(0.5)})
		p99 = append(p99, plotter.XY{X: float64(i) + 0.5, Y: q(0.99)})
		pmax = append(pmax, plotter.XY{X: float64(i) + 0.5, Y: q(1)})
		hi, lo = math.Max(hi, q(1)), math.Min(lo, q(0))
	}
	lo = math.Max(0.01, math.Min(lo, 1)/2)
	lp.Y.Min, lp.Y.Max = lo, hi*2
	if err := shade(lp, windows, lo, hi*2, true); err != nil {
		return err
	}
	for _, l := range []struct {
		pts  plotter.XYs
		c    color.Color
		name string
	}{{p50, color.RGBA{B: 200, A: 255}, "p50"}, {p99, color.RGBA{R: 230, G: 120, A: 255}, "p99"}, {pmax, color.RGBA{R: 150, B: 150, A: 255}, "max"}} {
		if len(l.pts) == 0 {
			continue
		}
		if err := addLine(lp, l.pts, l.c, l.name); err != nil {
			return err
		}
	}
	lp.Legend.Top = true

	const width, height = 12 * vg.Inch, 7 * vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8), PadY: vg.Points(6)}
	canvases := plot.Align([][]*plot.Plot{{tp}, {lp}}, tiles, dc)
	tp.Draw(canvases[0][0])
	lp.Draw(canvases[1][0])
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("report: writing the timeline: %w", err)
	}
	return nil
}

// second is one second of samples.
type second struct {
	ok, failed int
	lat        []time.Duration // of the ok samples, sorted
}

func bucket(samples []Sample) []second {
	var last time.Duration
	for _, s := range samples {
		last = max(last, s.At)
	}
	secs := make([]second, int(last/time.Second)+1)
	for _, s := range samples {
		i := int(max(s.At, 0) / time.Second)
		if s.OK {
			secs[i].ok++
			secs[i].lat = append(secs[i].lat, s.Latency)
		} else {
			secs[i].failed++
		}
	}
	for i := range secs {
		sort.Slice(secs[i].lat, func(a, b int) bool { return secs[i].lat[a] < secs[i].lat[b] })
	}
	return secs
}

func addLine(p *plot.Plot, pts plotter.XYs, c color.Color, name string) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return fmt.Errorf("report: %s line: %w", name, err)
	}
	l.Color = c
	l.Width = vg.Points(1.2)
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// windowColors shade successive fault kinds differently.
var windowColors = []color.Color{
	color.NRGBA{R: 255, G: 120, B: 120, A: 70},
	color.NRGBA{R: 120, G: 120, B: 255, A: 70},
	color.NRGBA{R: 255, G: 190, B: 80, A: 70},
	color.NRGBA{R: 110, G: 200, B: 110, A: 70},
}

// shade adds a translucent rectangle from lo to hi over each window, with
// its name at the top unless quiet (the upper panel names them).
func shade(p *plot.Plot, windows []Window, lo, hi float64, quiet bool) error {
	kinds := map[string]int{}
	for _, w := range windows {
		if _, ok := kinds[w.Name]; !ok {
			kinds[w.Name] = len(kinds)
		}
		from, to := w.From.Seconds(), math.Max(w.To.Seconds(), w.From.Seconds()+0.05)
		poly, err := plotter.NewPolygon(plotter.XYs{{X: from, Y: lo}, {X: to, Y: lo}, {X: to, Y: hi}, {X: from, Y: hi}})
		if err != nil {
			return fmt.Errorf("report: window %s: %w", w.Name, err)
		}
		poly.Color = windowColors[kinds[w.Name]%len(windowColors)]
		poly.LineStyle.Width = 0
		poly.LineStyle.Color = color.Transparent
		p.Add(poly)
		if quiet {
			continue
		}
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: from, Y: hi * 0.97}}, Labels: []string{w.Name}})
		if err != nil {
			return fmt.Errorf("report: window %s label: %w", w.Name, err)
		}
		p.Add(lbl)
	}
	return nil
}
