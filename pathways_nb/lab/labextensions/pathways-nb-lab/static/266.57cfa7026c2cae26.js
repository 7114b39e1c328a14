"use strict";(self.rspackChunkpathways_nb_lab=self.rspackChunkpathways_nb_lab||[]).push([[266],{646(e,t,r){var n=r(601),a=r.n(n),o=r(314),i=(r.n(o))()(a());i.push([e.id,`.pw-panel {
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
`,""]),r.d(t,{},{A:i})},314(e){e.exports=function(e){var t=[];return t.toString=function(){return this.map(function(t){var r="",n=void 0!==t[5];return t[4]&&(r+="@supports (".concat(t[4],") {")),t[2]&&(r+="@media ".concat(t[2]," {")),n&&(r+="@layer".concat(t[5].length>0?" ".concat(t[5]):""," {")),r+=e(t),n&&(r+="}"),t[2]&&(r+="}"),t[4]&&(r+="}"),r}).join("")},t.i=function(e,r,n,a,o){"string"==typeof e&&(e=[[null,e,void 0]]);var i={};if(n)for(var p=0;p<this.length;p++){var s=this[p][0];null!=s&&(i[s]=!0)}for(var c=0;c<e.length;c++){var l=[].concat(e[c]);n&&i[l[0]]||(void 0!==o&&(void 0===l[5]||(l[1]="@layer".concat(l[5].length>0?" ".concat(l[5]):""," {").concat(l[1],"}")),l[5]=o),r&&(l[2]&&(l[1]="@media ".concat(l[2]," {").concat(l[1],"}")),l[2]=r),a&&(l[4]?(l[1]="@supports (".concat(l[4],") {").concat(l[1],"}"),l[4]=a):l[4]="".concat(a)),t.push(l))}},t}},601(e){e.exports=function(e){return e[1]}},665(e,t,r){r.r(t);var n=r(72),a=r.n(n),o=r(825),i=r.n(o),p=r(659),s=r.n(p),c=r(56),l=r.n(c),u=r(540),d=r.n(u),f=r(113),v=r.n(f),m=r(646),h={};h.styleTagTransform=v(),h.setAttributes=l(),h.insert=s().bind(null,"head"),h.domAPI=i(),h.insertStyleElement=d(),a()(m.A,h);let x=m.A&&m.A.locals?m.A.locals:void 0;r.d(t,{},{default:x})},72(e){var t=[];function r(e){for(var r=-1,n=0;n<t.length;n++)if(t[n].identifier===e){r=n;break}return r}function n(e,n){for(var a={},o=[],i=0;i<e.length;i++){var p=e[i],s=n.base?p[0]+n.base:p[0],c=a[s]||0,l="".concat(s," ").concat(c);a[s]=c+1;var u=r(l),d={css:p[1],media:p[2],sourceMap:p[3],supports:p[4],layer:p[5]};if(-1!==u)t[u].references++,t[u].updater(d);else{var f=function(e,t){var r=t.domAPI(t);return r.update(e),function(t){t?(t.css!==e.css||t.media!==e.media||t.sourceMap!==e.sourceMap||t.supports!==e.supports||t.layer!==e.layer)&&r.update(e=t):r.remove()}}(d,n);n.byIndex=i,t.splice(i,0,{identifier:l,updater:f,references:1})}o.push(l)}return o}e.exports=function(e,a){var o=n(e=e||[],a=a||{});return function(e){e=e||[];for(var i=0;i<o.length;i++){var p=r(o[i]);t[p].references--}for(var s=n(e,a),c=0;c<o.length;c++){var l=r(o[c]);0===t[l].references&&(t[l].updater(),t.splice(l,1))}o=s}}},659(e){var t={};e.exports=function(e,r){var n=function(e){if(void 0===t[e]){var r=document.querySelector(e);if(window.HTMLIFrameElement&&r instanceof window.HTMLIFrameElement)try{r=r.contentDocument.head}catch(e){r=null}t[e]=r}return t[e]}(e);if(!n)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");n.appendChild(r)}},540(e){e.exports=function(e){var t=document.createElement("style");return e.setAttributes(t,e.attributes),e.insert(t,e.options),t}},56(e,t,r){e.exports=function(e){var t=r.nc;t&&e.setAttribute("nonce",t)}},825(e){e.exports=function(e){if("u"<typeof document)return{update:function(){},remove:function(){}};var t=e.insertStyleElement(e);return{update:function(r){var n,a,o;n="",r.supports&&(n+="@supports (".concat(r.supports,") {")),r.media&&(n+="@media ".concat(r.media," {")),(a=void 0!==r.layer)&&(n+="@layer".concat(r.layer.length>0?" ".concat(r.layer):""," {")),n+=r.css,a&&(n+="}"),r.media&&(n+="}"),r.supports&&(n+="}"),(o=r.sourceMap)&&"u">typeof btoa&&(n+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(o))))," */")),e.styleTagTransform(n,t,e.options)},remove:function(){var e;null===(e=t).parentNode||e.parentNode.removeChild(e)}}}},113(e){e.exports=function(e,t){if(t.styleSheet)t.styleSheet.cssText=e;else{for(;t.firstChild;)t.removeChild(t.firstChild);t.appendChild(document.createTextNode(e))}}}}]);