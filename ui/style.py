"""The page's own style sheet: the phone layout, the tour, the stale-views note, the chat
template's view. (A view's own styles live with its drawing: visualizer/.)"""

CSS = """
@media (max-width: 768px) {
  /* A phone: Run, then the preset and parameters, then the output, then the rest of the form. */
  #run-row {flex-direction: column;}
  #run-controls {display: contents;}
  #run-top {order: 1;}
  #run-knobs {order: 2;}
  #run-output {order: 3;}
  #run-more {order: 4;}
  #run-top, #run-knobs, #run-output, #run-more {width: 100%; min-width: 0;}
  /* Plotly's toolbar (only "download" is left) would sit on the figures' subtitles */
  .modebar-container {display: none;}
}
@media (max-width: 520px) {
  /* Every tab's name in the bar (gradio measures its hidden copies), none behind "⋯" */
  .tab-wrapper .tab-container button {padding-left: 7px !important; padding-right: 7px !important;}
}
.dl-hidden {display: none !important;}
#take-tour {max-width: 300px;}
.dl-stale {background: #e3f2fd; border-left: 4px solid #1565c0; padding: 6px 10px; border-radius: 4px;}
/* The tour: where we are, and the one thing to look at */
.dl-tour-where {font-size: 13px; color: #546e7a; text-transform: uppercase; letter-spacing: .04em;}
.dl-look {background: #fff8e1; border-left: 4px solid #f9a825; padding: 8px 10px; border-radius: 4px;}
.dl-tour-rule {font-size: 13px; color: #546e7a;}
/* A long name ends in an ellipsis before the dropdown's arrow, not under it (both tabs). */
#model input, #method input, #cmp-model input {text-overflow: ellipsis; padding-right: 1.6em;}
.dl-seen {font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px;
  line-height: 1.9; white-space: pre-wrap; word-break: break-word;}
.dl-seen span {border-radius: 3px; margin-right: 1px; padding: 1px 0;}
.dl-seen span.a {background: #eef2f5;} .dl-seen span.b {background: #e1e8ed;}
.dl-seen span.special {background: #fff3cd; color: #6d4c00;}
"""
