// MathJax 3 for pymdownx.arithmatex (generic mode), re-typeset on every page of Material's instant navigation.
// MathJax itself is shipped with the site (assets/vendor/mathjax, SVG output: no web fonts, nothing fetched).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
    // no context menu: its accessibility settings would load the speech rule engine from a CDN
    enableMenu: false
  }
};

document$.subscribe(() => {
  if (window.MathJax && MathJax.startup && MathJax.typesetPromise) {
    const output = MathJax.startup.output;  // SVG output: clearFontCache; CHTML output: clearCache
    (output.clearFontCache || output.clearCache).call(output);
    MathJax.typesetClear();
    MathJax.texReset();
    MathJax.typesetPromise();
  }
});
