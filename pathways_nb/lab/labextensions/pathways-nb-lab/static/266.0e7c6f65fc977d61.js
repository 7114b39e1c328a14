"use strict";(self.rspackChunkpathways_nb_lab=self.rspackChunkpathways_nb_lab||[]).push([[266],{646(e,t,n){var r=n(601),a=n.n(r),o=n(314),i=(n.n(o))()(a());i.push([e.id,`.pw-panel {
  padding: 6px 8px;
  overflow: auto;
  font-size: var(--jp-ui-font-size1);
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
}
.pw-panel-bar {
  display: flex;
  gap: 4px;
  flex-wrap: wrap;
}
.pw-panel-bar select,
.pw-panel-bar input {
  flex: 1 1 10em;
  min-width: 8em;
}
.pw-panel-error {
  color: var(--jp-error-color1);
}
.pw-panel table.dataframe {
  border-collapse: collapse;
  font-size: var(--jp-ui-font-size0);
}
.pw-panel table.dataframe td,
.pw-panel table.dataframe th {
  padding: 1px 6px;
  border-bottom: 1px solid var(--jp-border-color2);
  text-align: left;
}
.pw-panel h3,
.pw-panel h4 {
  margin: 10px 0 4px;
}
.pw-legend {
  display: flex;
  flex-wrap: wrap;
  gap: 4px 12px;
  margin: 2px 0 4px;
  font-size: var(--jp-ui-font-size0);
}
.pw-legend i {
  display: inline-block;
  width: 10px;
  height: 10px;
  margin-right: 4px;
  vertical-align: middle;
}
.pw-panel-launch,
.pw-panel-actions {
  margin-top: 4px;
  align-items: center;
}
.pw-panel-launch input {
  flex: 0 0 3.5em;
  min-width: 3.5em;
  width: 3.5em;
}
`,""]),n.d(t,{},{A:i})},314(e){e.exports=function(e){var t=[];return t.toString=function(){return this.map(function(t){var n="",r=void 0!==t[5];return t[4]&&(n+="@supports (".concat(t[4],") {")),t[2]&&(n+="@media ".concat(t[2]," {")),r&&(n+="@layer".concat(t[5].length>0?" ".concat(t[5]):""," {")),n+=e(t),r&&(n+="}"),t[2]&&(n+="}"),t[4]&&(n+="}"),n}).join("")},t.i=function(e,n,r,a,o){"string"==typeof e&&(e=[[null,e,void 0]]);var i={};if(r)for(var p=0;p<this.length;p++){var l=this[p][0];null!=l&&(i[l]=!0)}for(var c=0;c<e.length;c++){var s=[].concat(e[c]);r&&i[s[0]]||(void 0!==o&&(void 0===s[5]||(s[1]="@layer".concat(s[5].length>0?" ".concat(s[5]):""," {").concat(s[1],"}")),s[5]=o),n&&(s[2]&&(s[1]="@media ".concat(s[2]," {").concat(s[1],"}")),s[2]=n),a&&(s[4]?(s[1]="@supports (".concat(s[4],") {").concat(s[1],"}"),s[4]=a):s[4]="".concat(a)),t.push(s))}},t}},601(e){e.exports=function(e){return e[1]}},665(e,t,n){n.r(t);var r=n(72),a=n.n(r),o=n(825),i=n.n(o),p=n(659),l=n.n(p),c=n(56),s=n.n(c),u=n(540),d=n.n(u),f=n(113),v=n.n(f),m=n(646),h={};h.styleTagTransform=v(),h.setAttributes=s(),h.insert=l().bind(null,"head"),h.domAPI=i(),h.insertStyleElement=d(),a()(m.A,h);let x=m.A&&m.A.locals?m.A.locals:void 0;n.d(t,{},{default:x})},72(e){var t=[];function n(e){for(var n=-1,r=0;r<t.length;r++)if(t[r].identifier===e){n=r;break}return n}function r(e,r){for(var a={},o=[],i=0;i<e.length;i++){var p=e[i],l=r.base?p[0]+r.base:p[0],c=a[l]||0,s="".concat(l," ").concat(c);a[l]=c+1;var u=n(s),d={css:p[1],media:p[2],sourceMap:p[3],supports:p[4],layer:p[5]};if(-1!==u)t[u].references++,t[u].updater(d);else{var f=function(e,t){var n=t.domAPI(t);return n.update(e),function(t){t?(t.css!==e.css||t.media!==e.media||t.sourceMap!==e.sourceMap||t.supports!==e.supports||t.layer!==e.layer)&&n.update(e=t):n.remove()}}(d,r);r.byIndex=i,t.splice(i,0,{identifier:s,updater:f,references:1})}o.push(s)}return o}e.exports=function(e,a){var o=r(e=e||[],a=a||{});return function(e){e=e||[];for(var i=0;i<o.length;i++){var p=n(o[i]);t[p].references--}for(var l=r(e,a),c=0;c<o.length;c++){var s=n(o[c]);0===t[s].references&&(t[s].updater(),t.splice(s,1))}o=l}}},659(e){var t={};e.exports=function(e,n){var r=function(e){if(void 0===t[e]){var n=document.querySelector(e);if(window.HTMLIFrameElement&&n instanceof window.HTMLIFrameElement)try{n=n.contentDocument.head}catch(e){n=null}t[e]=n}return t[e]}(e);if(!r)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");r.appendChild(n)}},540(e){e.exports=function(e){var t=document.createElement("style");return e.setAttributes(t,e.attributes),e.insert(t,e.options),t}},56(e,t,n){e.exports=function(e){var t=n.nc;t&&e.setAttribute("nonce",t)}},825(e){e.exports=function(e){if("u"<typeof document)return{update:function(){},remove:function(){}};var t=e.insertStyleElement(e);return{update:function(n){var r,a,o;r="",n.supports&&(r+="@supports (".concat(n.supports,") {")),n.media&&(r+="@media ".concat(n.media," {")),(a=void 0!==n.layer)&&(r+="@layer".concat(n.layer.length>0?" ".concat(n.layer):""," {")),r+=n.css,a&&(r+="}"),n.media&&(r+="}"),n.supports&&(r+="}"),(o=n.sourceMap)&&"u">typeof btoa&&(r+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(o))))," */")),e.styleTagTransform(r,t,e.options)},remove:function(){var e;null===(e=t).parentNode||e.parentNode.removeChild(e)}}}},113(e){e.exports=function(e,t){if(t.styleSheet)t.styleSheet.cssText=e;else{for(;t.firstChild;)t.removeChild(t.firstChild);t.appendChild(document.createTextNode(e))}}}}]);