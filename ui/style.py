"""The page's own style sheet: the phone layout, the tour, the stale-views note, the chat
template's view. (A view's own styles live with its drawing: visualizer/.)"""

CSS = """
/* Gradio 6.31 ships SourceSansPro-SemiBold.woff2 and IBMPlexMono-SemiBold.woff2 as ~5 KB stubs
   (a few glyphs, A among them) and its default theme declares them for weight 600: bold text
   took those glyphs from the stub and the rest from the fallback, so a capital A read as a small
   capital ("SPᴀCE"). Weight 600 reads the full Bold files (the last @font-face wins). */
@font-face {font-family: 'Source Sans Pro'; font-weight: 600; font-style: normal;
  src: url('static/fonts/SourceSansPro/SourceSansPro-Bold.woff2') format('woff2');}
@font-face {font-family: 'IBM Plex Mono'; font-weight: 600; font-style: normal;
  src: url('static/fonts/IBMPlexMono/IBMPlexMono-Bold.woff2') format('woff2');}
@media (max-width: 768px) {
  /* A phone: Run, then the preset and parameters (closed until tapped: ON_LOAD), then the
     output, then the rest of the form. */
  #run-row {flex-direction: column;}
  #run-controls {display: contents;}
  #run-top {order: 1;}
  #run-knobs {order: 2;}
  #run-output {order: 3;}
  #run-more {order: 4;}
  #run-top, #run-knobs, #run-output, #run-more {width: 100%; min-width: 0;}
  /* Run lands on the tokens (SHOW_OUTPUT_ON_A_PHONE): the step controls and the method's views
     follow them, within one screen; the metrics, the timeline and the rest come after. */
  #run-output > * {order: 3;}
  #run-output > .form:has(#show-seen), #run-output > #seen, #run-output > #stale,
  #run-output > #tokens {order: 0;}
  #run-output > #run-stepper, #run-output > #panel, #run-output > [id^=panel] {order: 1;}
  #run-output > #metrics {order: 2;}
  /* Touch targets a finger can hit (44 px, Apple's and Material's minimum); Run and Stop, no
     longer held to gradio's 160 px, share one row. */
  #prev, #play, #pause, #next, #run-btn, #stop-btn,
  #tour-prev, #tour-next, #tour-prev-low, #tour-next-low, #tour-live,
  #tour-present, #tour-reveal, #tour-telling, #telling, #take-tour, .dl-tour-link button,
  .tab-wrapper .tab-container button {
    min-height: 44px; min-width: 44px;
  }
  /* The tour: the stop's figure (and its step) right under the picker and Prev / Next, then the
     narration's column as it is (what to look at in it, Run it live), then the numbers, the
     tokens and Prev / Next again. */
  #tour-row {flex-direction: column;}
  #tour-row > .column {display: contents;}
  #tour-row > .column > * {width: 100%; min-width: 0;}
  #tour-row > .column:first-child > * {order: 2;}
  #tour-row > .column:last-child > * {order: 3;}
  #tour-row > .column > #tour-panel, #tour-row > .column > #tour-second,
  #tour-row > .column > .row:has(#tour-step) {order: 1;}
  /* Plotly's toolbar (only "download" is left) would sit on the figures' subtitles */
  .modebar-container {display: none;}
}
@media (max-width: 520px) {
  /* Every tab's name in the bar (gradio measures its hidden copies), none behind "⋯" */
  .tab-wrapper .tab-container button {padding-left: 7px !important; padding-right: 7px !important;}
}
.dl-hidden {display: none !important;}
#take-tour {max-width: 440px;}
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
