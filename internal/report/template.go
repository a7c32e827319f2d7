package report

import "html/template"

// pageTmpl is the whole report page. No scripts and no external resources: the folder must read
// the same from a laptop, a CI artifact or a file:// URL.
var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>peregrine report{{range .Runs}} · {{.Title}}{{end}}</title>
<style>
:root { --fg:#1d2330; --muted:#5f6b7a; --line:#e3e7ee; --bg:#fafbfc; --accent:#4e79a7; --good:#2e7d32; --bad:#c62828; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; color:var(--fg); background:var(--bg); }
main { max-width:1100px; margin:0 auto; padding:24px 20px 64px; }
h1 { font-size:24px; margin:0 0 4px; }
h2 { font-size:20px; margin:48px 0 8px; padding-top:16px; border-top:2px solid var(--line); }
h3 { font-size:16px; margin:28px 0 8px; color:var(--muted); text-transform:uppercase; letter-spacing:.04em; }
.sub { color:var(--muted); margin:0 0 16px; }
nav a { margin-right:14px; color:var(--accent); text-decoration:none; }
table { border-collapse:collapse; width:100%; background:#fff; font-size:14px; margin:6px 0; }
th, td { text-align:left; padding:5px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:#f1f4f8; font-weight:600; }
td.num, th.num { font-variant-numeric:tabular-nums; white-space:nowrap; }
table.facts th { width:150px; background:none; color:var(--muted); font-weight:500; }
.banner { background:#fff4e5; border:2px solid #f0a030; color:#8a4b00; padding:12px 16px; border-radius:6px; font-weight:600; margin:12px 0; }
.problems { background:#fdecea; border:1px solid #e57373; padding:8px 16px; border-radius:6px; font-size:13px; }
figure { margin:18px 0; background:#fff; border:1px solid var(--line); border-radius:6px; padding:10px; }
figure img { width:100%; height:auto; display:block; }
figcaption { color:var(--muted); font-size:13px; margin-top:6px; }
.better { color:var(--good); } .worse { color:var(--bad); }
details { margin:6px 0; font-size:13px; } summary { cursor:pointer; color:var(--accent); }
code, pre { font-family:ui-monospace,SFMono-Regular,Menlo,monospace; font-size:12px; }
pre { white-space:pre-wrap; background:#fff; border:1px solid var(--line); padding:8px; }
footer { color:var(--muted); font-size:12px; margin-top:48px; }
</style>
</head>
<body><main>
<h1>peregrine report</h1>
<p class="sub">{{len .Runs}} run{{if ne (len .Runs) 1}}s{{end}} · generated {{.Generated}} · every ratio is median/median from the same run; spreads are min–max.</p>
{{if gt (len .Runs) 1}}<nav>{{range .Runs}}<a href="#{{.Anchor}}">{{.Title}}</a>{{end}}</nav>{{end}}
{{range .Runs}}
<section id="{{.Anchor}}">
<h2>{{.Title}}</h2>
{{if .Incomplete}}<div class="banner">INCOMPLETE: this run did not finish{{with .Run.Error}} ({{.}}){{end}}. Only what was measured is shown; missing points are missing, not zero.</div>{{end}}
{{if .Problems}}<div class="problems"><b>Consistency problems found in this run's data:</b><ul>{{range .Problems}}<li>{{.}}</li>{{end}}</ul></div>{{end}}
<table class="facts">{{range .Facts}}<tr><th>{{index . 0}}</th><td>{{index . 1}}</td></tr>{{end}}
{{with .Fixed}}<tr><th>fixed</th><td>{{.}}</td></tr>{{end}}</table>

<h3>Configurations</h3>
<table><tr><th>config</th><th>style</th><th>mode</th><th>placement</th><th>knobs</th><th>arrangement</th></tr>
{{range .Configs}}<tr><td><b>{{.Name}}</b></td><td>{{.Style}}</td><td>{{.Mode}}</td><td>{{.Placement}}</td><td>{{.Knobs}}</td><td>{{.Arrangement}}</td></tr>{{end}}
</table>
{{with .Offloads}}
<h3>Offloads</h3>
<table><tr><th>device</th>{{range .Columns}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr><td><code>{{.Device}}</code></td>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>{{end}}
</table>
<details><summary>every feature</summary>{{range .Full}}<p><b>{{.Column}}</b></p><pre>{{range .Lines}}{{.}}
{{end}}</pre>{{end}}</details>
{{end}}

{{with .FlowNote}}<p class="sub"><b>Flows:</b> {{.}}</p>{{end}}
{{with .OtherLoad}}<p class="problems"><b>Shared machine:</b> {{.}}</p>{{end}}

{{if .Figures}}<h3>Charts</h3>{{end}}
{{range .Figures}}<figure><img src="{{.File}}" alt="{{.Caption}}"><figcaption>{{.Caption}}</figcaption></figure>
{{end}}

{{if .Ratios}}<h3>Ratios vs {{.Baseline}}</h3>
<table><tr><th>metric</th><th>at</th><th>config</th><th class="num">ratio [min–max]</th><th>change</th></tr>
{{range .Ratios}}<tr><td>{{.Metric}}</td><td>{{.X}}</td><td>{{.Numerator}}</td><td class="num">{{.Ratio}}</td><td class="{{if .Better}}better{{else if .Worse}}worse{{end}}">{{.Change}}</td></tr>{{end}}
</table>{{end}}

{{if .Table.Rows}}<h3>All points</h3>
<table><tr>{{range .Table.Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Table.Rows}}<tr>{{range .}}<td class="num">{{.}}</td>{{end}}</tr>{{end}}
</table>{{end}}

{{if .IRQs.Rows}}<h3>Interrupts and softirqs</h3>
<p class="sub">{{.IRQLegend}}</p>
<table><tr>{{range .IRQs.Head}}<th>{{.}}</th>{{end}}</tr>
{{range .IRQs.Rows}}<tr>{{range .}}<td class="num">{{.}}</td>{{end}}</tr>{{end}}
</table>{{end}}

{{if .Reorder.Rows}}<h3>Reordering and loss</h3>
<p class="sub">{{.ReorderLeg}}</p>
<table><tr>{{range .Reorder.Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Reorder.Rows}}<tr>{{range .}}<td class="num">{{.}}</td>{{end}}</tr>{{end}}
</table>{{end}}

{{if .Cost.Rows}}<h3>Cost per delivered packet</h3>
<p class="sub">CPU = all CPUs' busy time per delivered packet (sender included); RECEIVE = NET_RX softirq time charged to this path's devices, every stage (other traffic on a shared machine is not in it, but is in CPU and IRQ CPU); IRQ CPU = the IRQ CPUs' busy time; SENDER = the injector's own CPU per sent packet; BPF = the datapath's eBPF programs, net of an empty calibration program measured in the same rep; PROBE = the stage probe's own programs.</p>
<table><tr>{{range .Cost.Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Cost.Rows}}<tr>{{range .}}<td class="num">{{.}}</td>{{end}}</tr>{{end}}
</table>{{end}}
{{if .Programs.Rows}}<h3>eBPF programs</h3>
<table><tr>{{range .Programs.Head}}<th>{{.}}</th>{{end}}</tr>
{{range .Programs.Rows}}<tr>{{range .}}<td class="num">{{.}}</td>{{end}}</tr>{{end}}
</table>{{end}}

{{range .Stages}}<h3>Receive stages: {{.Config}}</h3>
<table><tr><th>stage</th><th>CPU</th><th class="num">packets</th><th class="num">share of stage</th><th class="num">softirq ns/packet</th><th>devices</th></tr>
{{range .Rows}}<tr><td>{{.Stage}}</td><td>{{.CPU}}</td><td class="num">{{.Packets}}</td><td class="num">{{.Share}}</td><td class="num">{{.NsPerPkt}}</td><td><code>{{.Devices}}</code></td></tr>{{end}}
</table>{{end}}

{{with .Run.Notes}}<h3>Notes</h3><ul>{{range .}}<li>{{.}}</li>{{end}}</ul>{{end}}
</section>
{{end}}
<footer>peregrine · schema {{.Schema}} · raw data in the run JSON files</footer>
</main></body></html>
`))
