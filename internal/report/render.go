package report

import (
	"bufio"
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot geometry: 8×4.5 in at 120 dpi gives 960×540 px, sharp on a laptop and light to load.
const (
	plotW = 8 * vg.Inch
	plotH = 4.5 * vg.Inch
	dpi   = 120
)

// palette is Tableau 10: distinguishable, and readable by most colour-blind readers.
var palette = []color.Color{
	rgb(0x4e79a7), rgb(0xf28e2b), rgb(0xe15759), rgb(0x76b7b2), rgb(0x59a14f),
	rgb(0xedc948), rgb(0xb07aa1), rgb(0xff9da7), rgb(0x9c755f), rgb(0xbab0ac),
}

func rgb(v uint32) color.RGBA {
	return color.RGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 0xff}
}

func colorAt(i int) color.Color { return palette[i%len(palette)] }

var glyphs = []draw.GlyphDrawer{
	draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.RingGlyph{},
	draw.BoxGlyph{}, draw.PyramidGlyph{}, draw.CrossGlyph{}, draw.PlusGlyph{},
}

// chart is a plot whose legend is drawn beside it rather than over the data: with bars reaching
// 100 % and lines near the top, an inner legend hides exactly what matters.
type chart struct {
	p      *plot.Plot
	legend []legendItem
}

type legendItem struct {
	name  string
	thumb plot.Thumbnailer
}

func newPlot(title, xlabel, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = vg.Points(12)
		a.Tick.Label.Font.Size = vg.Points(10)
	}
	return p
}

// legendWidth reserves room for the longest entry.
func (c *chart) legendWidth(sty plot.Legend) vg.Length {
	if len(c.legend) == 0 {
		return 0
	}
	var w vg.Length
	for _, it := range c.legend {
		w = max(w, sty.TextStyle.Width(it.name))
	}
	return w + sty.ThumbnailWidth + vg.Points(24)
}

// save renders the chart to a PNG file.
func (c *chart) save(path string) error {
	img := vgimg.NewWith(vgimg.UseWH(plotW, plotH), vgimg.UseDPI(dpi), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	leg := plot.NewLegend()
	leg.TextStyle.Font = font.From(plot.DefaultFont, vg.Points(11))
	leg.Top, leg.Left = true, true
	leg.Padding = vg.Points(4)
	leg.YOffs = -vg.Points(30) // level with the top of the data area, below the title
	lw := c.legendWidth(leg)
	c.p.Draw(draw.Crop(dc, 0, -lw, 0, 0))
	if lw > 0 {
		for _, it := range c.legend {
			leg.Add(it.name, it.thumb)
		}
		leg.Draw(draw.Crop(dc, plotW-lw+vg.Points(8), 0, 0, 0))
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	w := bufio.NewWriter(f)
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		f.Close()
		return fmt.Errorf("plot %s: %w", path, err)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return nil
}

// hGrid is a horizontal-only grid for bar charts, where vertical lines only cut through gaps.
func hGrid() *plotter.Grid {
	g := plotter.NewGrid()
	g.Vertical.Width = 0
	return g
}

// dataWidth estimates the width of the data area, to size bars in absolute units.
func (c *chart) dataWidth() vg.Length {
	return plotW - c.legendWidth(plot.NewLegend()) - vg.Points(70)
}
